"""The HTTP API's shared vocabulary: what the server and the client both need to agree on.

- :mod:`motus.api.schemas`: the request and response bodies of the REST contract
  (``serving-api.md``) as pydantic models;
- :mod:`motus.api.webhook_urls`: the syntactic checks of a webhook's URL and token, which the
  request schema applies when a message is posted;
- :mod:`motus.api.approvers`: who may answer an approval (a tool's ``approvers``,
  ``self_approval`` and ``quorum``), written by the tool into its interrupt, checked by the
  server and read by the clients to offer only what a key may answer.

Both the server (``motus.serve``) and the client (``motus.client``) import this package; it
imports neither, so ``import motus.client`` never loads the server.
"""
