"""The broker's keepers, bound to Celery and kombu: no message is lost or held by nobody (Redis or RabbitMQ).

- ``tasks.broker.holdings``: who holds which unacknowledged message (kombu's ``unacked``), swept back
  when its holder is dead.
- ``tasks.broker.primary_watch``: after a Redis failover, messages taken before it and held by nobody go back.
- ``tasks.broker.lost_fetches`` / ``lost_analyses``: leased batches whose message was lost, sent again.
- ``tasks.broker.redelivery``: messages stopped workers took and never acknowledged, handed back.
- ``tasks.broker.guard``: patches of kombu's Redis transport (QoS guard, client reuse, reconnect pace).
- ``tasks.broker.redis_check``: what vcrawl needs from Redis to lose nothing, checked at worker start.
- ``tasks.broker.queues``: how many messages wait on each queue.
- ``tasks.broker.amqp``: the same on RabbitMQ, and a dead ring node's queue moved (where the keepers above
  of Redis's broker are off: RabbitMQ hands a closed connection's messages back itself).
- ``tasks.broker.amqp_holdings``: on RabbitMQ, the fetches each worker holds (its leases go back when it dies).
- ``tasks.broker.bundle_ledger``: what a fetch bundle leased for itself, taken over when its message comes back.
"""
