//go:build !race

package checkpoint_test

// manyEmpty is how many transactions without events the million-transaction test commits.
const manyEmpty = 1_000_000
