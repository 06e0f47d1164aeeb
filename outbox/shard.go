package outbox

import _ "embed"

// ShardFunctionSQL creates outbox_shard(aggregate_id text, shards integer), the SQL function that
// chooses an aggregate's shard of a sharded outbox as Kafka's Java producer chooses a partition
// (toPositive(murmur2(key)) % shards; docs/scaling.md). Run it once per database, as a role that
// may create functions, for writers that pick the shard's table in SQL.
//
//go:embed shard.sql
var ShardFunctionSQL string
