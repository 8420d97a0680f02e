"""The one exception every call of the package raises."""

# docs/openapi.json's error codes and their HTTP statuses.
STATUS_OF_CODE = {
    "invalid_argument": 400,
    "unauthenticated": 401,
    "not_found": 404,
    "method_not_allowed": 405,
    "conflict": 409,
    "payload_too_large": 413,
    "unavailable": 503,
    "deadline_exceeded": 504,
    "data_loss": 500,
    "resource_exhausted": 507,
    "internal": 500,
}

_CODE_OF_STATUS = {
    400: "invalid_argument",
    401: "unauthenticated",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    503: "unavailable",
    504: "deadline_exceeded",
    507: "resource_exhausted",
}


def code_of_status(status):
    """The docs/openapi.json code of an HTTP status, for answers without a JSON error."""
    return _CODE_OF_STATUS.get(status, "internal")


class TesseraError(Exception):
    """A failed call to tesserad or to a worker.

    Attributes:
      code:    docs/openapi.json's code ("invalid_argument", "not_found", "conflict",
               "unavailable", "deadline_exceeded", ...).
      status:  the HTTP status of the answer; 0 when there was no answer
               (connection refused, timed out, or an error found before any call).
      details: the culprit, as a dict: field, tensor, worker, rank, mesh, step, ...
      message: the human sentence (also ``str(error)``).
    """

    def __init__(self, code, message, status=0, details=None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.details = dict(details or {})

    def __str__(self):
        return self.message

    def __reduce__(self):
        # Picklable, so that it crosses processes whole (DCP gathers every rank's errors).
        return (TesseraError, (self.code, self.message, self.status, self.details))

    def __repr__(self):
        return "TesseraError(code=%r, status=%r, message=%r, details=%r)" % (
            self.code, self.status, self.message, self.details)


def invalid_argument(message, **details):
    """An error in the caller's input, found before any call."""
    return TesseraError("invalid_argument", message, 0, details)
