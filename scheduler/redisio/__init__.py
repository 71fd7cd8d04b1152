"""The Redis I/O around the wire format of :mod:`scheduler.protocol`: connections from URLs
(:mod:`.connection`, :mod:`.connectors`), the script transports with their retries and cluster
routing (:mod:`.transport`, :mod:`.transport_async`, :mod:`.batch`, :mod:`.routing`) and pub/sub
(:mod:`.pubsub`). Everything here may import redis-py; nothing in :mod:`scheduler.protocol` does."""
