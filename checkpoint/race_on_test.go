//go:build race

package checkpoint_test

// manyEmpty is how many transactions without events the million-transaction test commits: a
// tenth under the race detector, which makes each lock and allocation ten times dearer (14 s for
// the million); the count still dwarfs any queue that would be constant by accident.
const manyEmpty = 100_000
