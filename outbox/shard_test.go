package outbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/outbox"
	"github.com/outbox-relay/outbox-relay/sink/producer"
)

// The SQL shard function must agree with the relay's murmur2 (Kafka's) for every key length's
// tail (0-3 bytes past a multiple of four), multibyte UTF-8, and shard counts that are and are
// not powers of two; the bits above 32 that bigint arithmetic could leak show up as a mismatch.
// A shard count below one is refused.
func TestTheSQLShardFunctionChoosesAsKafkasMurmur2Does(t *testing.T) {
	ctx := context.Background()
	_, pool := newDB(t)
	if _, err := pool.Exec(ctx, outbox.ShardFunctionSQL); err != nil {
		t.Fatalf("creating outbox_shard: %v", err)
	}
	keys := []string{"", "a", "ab", "abc", "abcd", "abcde", "o-1001", "order-42",
		"ünïcödé-€-🙂", "0f8fad5b-d9cb-469f-a165-70867728950e", "ÿÿÿÿÿ"}
	for i := range 200 {
		keys = append(keys, strings.Repeat("k", i%13)+string(rune('a'+i%26))+strings.Repeat("é", i%5))
	}
	for _, n := range []int{1, 2, 3, 4, 7, 16, 1000} {
		for _, key := range keys {
			var got int
			if err := pool.QueryRow(ctx, "SELECT outbox_shard($1, $2)", key, n).Scan(&got); err != nil {
				t.Fatalf("outbox_shard(%q, %d): %v", key, n, err)
			}
			want := int((producer.Murmur2([]byte(key)) & 0x7fffffff) % uint32(n))
			if got != want {
				t.Errorf("outbox_shard(%q, %d) = %d, murmur2 chooses %d", key, n, got, want)
			}
		}
	}

	t.Run("fewer than one shard is refused with an error naming the count", func(t *testing.T) {
		var got int
		err := pool.QueryRow(ctx, "SELECT outbox_shard('o-1', 0)").Scan(&got)
		if err == nil || !strings.Contains(err.Error(), "shards must be 1 or more, got 0") {
			t.Fatalf("outbox_shard('o-1', 0) = %d, %v; want the error naming the shard count", got, err)
		}
	})
}
