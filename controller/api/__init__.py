"""The public port (9003): the HTTP routes and their OpenAPI document, the Fluvio admin protocol,
and what both share (admin operations, the expensive-read gate, list answers, watch fan-out).

Writes user specs only, never a status and never the local store. Imports nothing here, so that
loading one module of the package (a client, a codec) does not load the server.
"""
