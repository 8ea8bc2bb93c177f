"""Where vcrawl connects, as URLs and what they hold: Redis (one server, TLS, Sentinel, a Cluster), the
records database, and the clusters one monitor watches; each checked and shown without its password."""
