"""The REST API under ``gpu-pool/api/v1/`` (docs/api.md): the handlers (``handlers``, ``resume``), the JSON
they answer (``views``, ``dashboard``), who is asking (``identity``) and each user's hint rate (``hints``)."""
