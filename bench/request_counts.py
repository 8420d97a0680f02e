"""tesserad's answered requests by 'METHOD route', from its /metrics
(tessera_http_requests_total): what the benchmarks count per save or checkpoint."""

import urllib.request


def request_counts(cluster, skip):
    """'METHOD route' → requests tesserad answered, less /metrics, the mesh
    registrations (PUT /api/v1/meshes/{name}) and those for which
    skip(method, route) is true. `cluster`: .server, .token (and .tls_ca for https)."""
    req = urllib.request.Request(cluster.server + "/metrics",
                                 headers={"Authorization": "Bearer " + cluster.token})
    ctx = None
    if cluster.server.startswith("https"):
        import ssl  # noqa: PLC0415
        ctx = ssl.create_default_context(cafile=cluster.tls_ca)
    with urllib.request.urlopen(req, timeout=30, context=ctx) as r:
        text = r.read().decode()
    out = {}
    prefix = 'tessera_http_requests_total{route="'
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        route = line[len(prefix):line.index('"', len(prefix))]
        method = line.split('method="')[1].split('"')[0]
        if route == "/metrics" or (method == "PUT" and route == "/api/v1/meshes/{name}") or \
                skip(method, route):
            continue
        key = method + " " + route
        out[key] = out.get(key, 0) + float(line.rsplit(" ", 1)[1])
    return out
