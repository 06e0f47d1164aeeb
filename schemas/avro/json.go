package avro

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// node is a parsed JSON value that keeps member order (inferred records list their fields in
// document order) and a number's text (to tell an int from a long from a double, as Jackson's
// number nodes, and so Debezium, do).
type node struct {
	kind    byte // 'o' object, 'a' array, 's' string, 'n' number, 'b' boolean, 'z' null
	str     string
	num     json.Number
	boolean bool
	keys    []string
	vals    []*node // object members (in keys' order) or array elements
}

// parse parses one JSON document.
func parse(b []byte) (*node, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	n, err := parseNode(dec)
	if err != nil {
		return nil, fmt.Errorf("the payload is not JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("the payload is not JSON: content after the JSON value")
	}
	return n, nil
}

func parseNode(dec *json.Decoder) (*node, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch v := tok.(type) {
	case json.Delim:
		n := &node{kind: 'a'}
		if v == '{' {
			n.kind = 'o'
		}
		for dec.More() {
			if n.kind == 'o' {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				n.keys = append(n.keys, k.(string))
			}
			child, err := parseNode(dec)
			if err != nil {
				return nil, err
			}
			n.vals = append(n.vals, child)
		}
		if _, err := dec.Token(); err != nil { // the closing delimiter
			return nil, err
		}
		return n, nil
	case string:
		return &node{kind: 's', str: v}, nil
	case json.Number:
		return &node{kind: 'n', num: v}, nil
	case bool:
		return &node{kind: 'b', boolean: v}, nil
	case nil:
		return &node{kind: 'z'}, nil
	}
	return nil, errors.New("unexpected JSON token")
}

// member is the value of an object's member name, the last one where the document repeats it
// (as Jackson keeps it), or nil.
func (n *node) member(name string) *node {
	for j := len(n.keys) - 1; j >= 0; j-- {
		if n.keys[j] == name {
			return n.vals[j]
		}
	}
	return nil
}

// numberType is the Avro type a JSON number is inferred as: an integer that fits 32 bits is an
// int, one that fits 64 bits a long, anything else (a fraction, an exponent, a larger integer)
// a double. These are Kafka Connect's INT32, INT64 and FLOAT64 as Debezium infers them, and
// Connect's Avro converter maps them to int, long and double.
func numberType(n json.Number) string {
	s := string(n)
	if strings.ContainsAny(s, ".eE") {
		return "double"
	}
	if v, err := strconv.ParseInt(s, 10, 64); err == nil {
		if v >= math.MinInt32 && v <= math.MaxInt32 {
			return "int"
		}
		return "long"
	}
	return "double"
}

// kindName names a JSON value's kind for an error message.
func kindName(n *node) string {
	switch n.kind {
	case 'o':
		return "an object"
	case 'a':
		return "an array"
	case 's':
		return "a string"
	case 'n':
		return "the number " + string(n.num)
	case 'b':
		return "a boolean"
	}
	return "null"
}
