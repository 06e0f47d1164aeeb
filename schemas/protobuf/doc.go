// Package protobuf is the Protobuf format of the registry-backed encodings (value_encoding:
// protobuf): it infers a proto3 schema from an outbox event's JSON payload, encodes the payload
// as a message of a schema (inferred, or the registry's in strict mode), and decodes a message
// back to JSON for consumers. It does no I/O: the registry and the Confluent framing (magic byte
// and schema id) are the caller's (package schemas).
//
// # What Encode returns
//
// Encode returns the message's Confluent message-index list ([0] for the file's first message)
// and the serialized message; the caller frames them: magic byte, 4-byte schema id, the list as
// sr.ConfluentHeader writes it (the single byte 0 for [0]), the message. Decode takes the list
// read back from the framing and the message.
//
// # How a JSON payload maps to a schema (Infer)
//
// The payload must be a JSON object: it becomes a proto3 message named name (made a Protobuf
// identifier) in package namespace (no package when namespace is empty). Each member becomes a
// field:
//
//   - a string is `optional string`, true/false `optional bool`;
//   - a number without fraction or exponent that fits 64 bits is `optional int64`, any other
//     number `optional double` (int64 for every integer, so a count that grows past 2^31 does not
//     change the schema; a member that is sometimes 2 and sometimes 2.5 does, and int64 to double
//     is a wire-type change the registry's compatibility check refuses);
//   - an object is a message type nested in the parent message, named after the member in
//     PascalCase (Address for "address"), and a field of that type;
//   - an array is a repeated field of its elements' type: numbers merge to int64 or double, objects
//     merge into one nested message with the union of their members (a member with two types in
//     two elements is an error); an array of arrays, an array mixing kinds, or an array holding a
//     null cannot be said in Protobuf and is an error naming the member;
//   - null and the empty array carry no type: the member is left out of the schema and of the
//     message (as Debezium's JSON expansion leaves them out), so a consumer sees it absent.
//
// Scalars are proto3 `optional` so that presence survives: a 0, "" or false that was in the
// payload is in the decoded JSON too.
//
// Field names are the member names where they are Protobuf identifiers; other characters become
// '_' (a leading digit or '_' gets the prefix "f_", a name taken twice the suffix "_2"), and every
// field carries json_name = the member name, so Encode accepts the payload as written and Decode
// gives the member names back.
//
// Field numbers come from the member's name, not its place: 1 + FNV-1a(name) mod 2^25 - 1
// (skipping Protobuf's reserved 19000-19999; two names of one message that meet on one number
// take the next free one in name order). The same member has the same number in every schema
// inferred for any event, so a member that appears or disappears from one event to the next is a
// compatible change (a field added or removed), and a consumer's generated code keeps working. A
// tag costs up to 4 bytes instead of 1: the price of numbers that never move.
//
// Evolution: the Serializer (auto_register) does not register each event's schema as inferred:
// Widen merges it into the subject's latest inferred schema, which therefore only grows (a member
// left out or null reuses the subject's schema; a member that appears is a new version, a field
// added). A member whose type changes (int64, then string; a scalar, then an array) keeps the
// event's type in the merge, and the registry refuses the change under BACKWARD:
// schema_incompatible. A field's number never changes, since it comes from its name.
//
// Fields and nested messages are written in name order, so two payloads with the same members in
// another order infer the same schema text (and the caller's cache finds one id for both).
//
// # Encode and strict schemas
//
// Encode parses the schema text with protocompile (google/protobuf/*.proto imports resolved from
// the well-known types; references to other subjects are not resolved and are an error), takes
// the file's first top-level message (or Format.Message), and converts the JSON payload with the
// proto3 JSON mapping: members by json_name or field name; a 64-bit integer from a number or a
// string; an integer field also from 1e3 or 2.0, never from 2.5 or beyond its range; enums by
// name or number; bytes from base64; well-known types (Timestamp, Duration, Struct, wrappers) in
// their JSON forms; a null member is the field unset. A member the message has no field for (but
// a null or [], which an inferred schema leaves out), or a value that does not fit its field, is a
// *FieldError (wrapping ErrMismatch) naming the member's path (lines[1].qty) and what was wanted:
// a strict schema never drops data silently. Parsed schemas are cached by text.
//
// # Decode
//
// Decode gives the message as JSON: members named by their json_name (the member names for an
// inferred schema; protojson's lowerCamelCase for a user schema without json_name), in field
// number order, 64-bit integers as JSON numbers (not protojson's strings, so a consumer reads back
// the numbers that were written), enums by name, bytes as base64, well-known types as protojson
// writes them. Unset fields are left out.
package protobuf
