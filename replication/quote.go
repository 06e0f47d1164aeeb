package replication

import "strings"

// quoteLiteral quotes s as an SQL string literal, for the replication protocol's commands, which
// take no parameters.
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}
