package producer

import (
	"errors"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol/addpartitionstotxn"
)

// TestAnAddPartitionsAnswerNamesTheTopicsItRefused: the broker refuses the topics the relay may
// not write and attempts none of the other partitions of the request; the answer names the
// refused topics, so that the others can be asked for again without them. Any other error wins.
func TestAnAddPartitionsAnswerNamesTheTopicsItRefused(t *testing.T) {
	result := func(topic string, code kafka.Error) addpartitionstotxn.ResponseResult {
		return addpartitionstotxn.ResponseResult{Name: topic, Results: []addpartitionstotxn.ResponsePartition{{PartitionIndex: 0, ErrorCode: int16(code)}}}
	}
	tests := []struct {
		name    string
		results []addpartitionstotxn.ResponseResult
		refused []string
		want    error
	}{
		{"all added", []addpartitionstotxn.ResponseResult{result("a", 0), result("b", 0)}, nil, nil},
		{"one topic refused, the other not attempted",
			[]addpartitionstotxn.ResponseResult{result("a", ErrOperationNotAttempted), result("denied", kafka.TopicAuthorizationFailed)}, []string{"denied"}, kafka.TopicAuthorizationFailed},
		{"another error wins", []addpartitionstotxn.ResponseResult{result("denied", kafka.TopicAuthorizationFailed), result("b", kafka.ProducerFenced)}, nil, kafka.ProducerFenced},
		{"not attempted alone", []addpartitionstotxn.ResponseResult{result("a", ErrOperationNotAttempted)}, nil, ErrOperationNotAttempted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := addResult(&addpartitionstotxn.Response{Results: tt.results})
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("addResult = %v, want %v", err, tt.want)
			}
			var refused *TopicsRefusedError
			if errors.As(err, &refused) != (tt.refused != nil) {
				t.Fatalf("addResult = %v (%T), refused topics want %v", err, err, tt.refused)
			}
			for _, topic := range tt.refused {
				if !refused.Topics[topic] || !strings.Contains(err.Error(), topic) {
					t.Errorf("%v does not name %s", err, topic)
				}
			}
		})
	}
}
