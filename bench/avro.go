package main

// The Avro drain: the relay with value_encoding and key_encoding avro, framing every record with
// the id of a schema inferred from the payload and registered in a real schema registry (Apicurio,
// started by StartServices as Kafka is, only when this side runs), beside the JSON drain (side
// relay) of the same backlog. The goal: within 10% of the JSON drain (avroVsRelay >= 0.9). The
// relay's registry client caches the ids, so the drain makes one registry round trip per topic
// and schema, not per event: the difference is the Avro encoding itself.

import "errors"

const sideRelayAvro = "relay-avro"

// avroVsRelay is the Avro drain against the JSON drain of the same round.
var avroVsRelay = comparison{name: "Avro drain / JSON drain", side: sideRelayAvro, base: sideRelay, of: rateRatio}

// avroArgs are the relay's flags of the Avro side.
func (b *bench) avroArgs() ([]string, error) {
	if b.svc.Registry == nil {
		return nil, errors.New("side relay-avro needs a schema registry: StartServices starts one when the side is asked for (ServiceOptions.Registry)")
	}
	return []string{"--value-encoding=avro", "--key-encoding=avro", "--schema-registry.urls=" + b.svc.Registry.ConfluentURL()}, nil
}
