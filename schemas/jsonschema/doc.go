// Package jsonschema is the JSON Schema format of the registry-backed encodings (value_encoding:
// json-schema): it infers a JSON Schema (draft-07) from an outbox event's JSON payload, checks a
// payload against a schema (inferred, or the registry's in strict mode) and writes it, and reads
// it back for consumers. The data is the JSON document itself, as Confluent's JSON Schema
// serializer writes it; the Confluent framing (magic byte, schema id) is the caller's (package
// schemas). It does no I/O: a schema's $ref to anything outside itself is an error.
//
// # How a JSON payload maps to a schema (Infer)
//
// The schema is a draft-07 document with "$schema", a "title" (namespace.name, or name) and the
// payload's shape:
//
//   - a string is {"type":"string"}, true/false {"type":"boolean"}, any number {"type":"number"}
//     ("number" for integers too: a member that is 2 in one event and 2.5 in the next keeps one
//     schema, where "integer" then "number" would be two versions and "number" then "integer" an
//     incompatible one);
//   - an object is {"type":"object","properties":{...},"additionalProperties":false}, with no
//     "required": a closed content model, so that a member that appears in a later event is a
//     compatible change under BACKWARD (a registry refuses a property added to an open model);
//   - an array is {"type":"array","items":...}, the items' schema merged from every element: the
//     types of the elements become a type list ({"type":["number","string"]}), objects merge
//     their properties (a member's schemas merged the same way; a member null in one element and
//     typed in another is nullable, {"type":["null","number"]}), and a null element adds "null";
//   - a null member and an empty array carry no type: the member is left out of the schema (as
//     Debezium's JSON expansion leaves it out), and out of the written payload (see Encode).
//
// Properties are written in name order, so two payloads with the same members in another order
// infer the same schema text (and the caller's cache finds one id for both).
//
// Evolution under the registry's BACKWARD rule (as Apicurio Registry checks it): a property added
// to a closed model is a compatible change; one removed, or a type changed, is not. So the
// Serializer (auto_register) does not register each event's schema as inferred: Widen merges it
// into the subject's latest inferred schema, which therefore only grows. A member that appears is
// a new version; a member left out, null or [] reuses the subject's schema (the event fits it: no
// property is required, and a null member is left out of the data, see Encode); a member whose
// type changes (a number, then a string) keeps the event's type in the merge, and the registry
// refuses the change: schema_incompatible.
//
// # Encode and strict schemas
//
// Encode validates the payload against the schema (draft-07 unless the schema's "$schema" says
// otherwise; "format" is not asserted). A payload that does not fit returns a *FieldError naming
// the member (its path, e.g. lines[0].qty) and the rule it breaks, wrapping ErrMismatch. The data
// written is the payload as it is, unless it fits the schema only without its null and [] members
// (an inferred schema has no property for them and allows no others; a strict schema may type a
// member that is null): then those members are left out and the payload is written compactly
// with its members in name order. Compiled schemas are cached by text.
//
// # Decode
//
// Decode returns the data (a JSON document) as it is, after checking it is JSON; it does not
// validate it again (the writer did).
package jsonschema
