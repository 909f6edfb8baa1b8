"""aotc_client: a client for Open Inference Protocol servers. Needs numpy and tritonclient, never torch."""
