//go:build !race

package relayproc

const raceEnabled = false
