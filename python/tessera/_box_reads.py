"""Boxes of a committed checkpoint read through a worker's local API
(POST /v1/checkpoints/{step}/read, docs/local-api.md): only the chunks each box
needs, checksums checked by the worker, in batches of at most `batch_bytes`."""

from ._http import query

# One read call asks the worker for at most this many bytes.
BATCH_BYTES = 256 << 20


def read_boxes(endpoint, mesh, step, boxes, timeout, batch_bytes=BATCH_BYTES, writable=True):
    """Reads [(tag, tensor name, offsets, lengths, nbytes)] from checkpoint `step` of
    `mesh` through `endpoint` (a worker's _http.Endpoint); yields (tag, memoryview) in
    order, each box's bytes contiguous in row-major order. Each batch's answer is one
    buffer, viewed per box: writable (one copy of the answer) or, for a caller that
    copies anyway, the answer's own read-only bytes."""
    path = "/v1/checkpoints/%d/read%s" % (int(step), query({"mesh": mesh}))
    batch, size = [], 0
    for box in list(boxes) + [None]:
        if batch and (box is None or size + box[4] > batch_bytes):
            body = {"reads": [{"tensor": b[1], "offsets": list(b[2]), "lengths": list(b[3])}
                              for b in batch]}
            _, _, data = endpoint.call("POST", path, body, timeout=timeout)
            whole = memoryview(bytearray(data) if writable else data)
            del data
            at = 0
            for b in batch:
                yield b[0], whole[at:at + b[4]]
                at += b[4]
            batch, size = [], 0
        if box is not None:
            batch.append(box)
            size += box[4]
