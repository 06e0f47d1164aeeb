package sink

// EncodeKey encodes a raw aggregate id as the sink encodes record keys with enc, for tools that
// publish records the relay would have published (redrive).
func EncodeKey(aggregateID []byte, enc ValueEncoding) []byte { return encodeValue(aggregateID, enc) }
