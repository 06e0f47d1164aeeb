//go:build race

package relayproc

const raceEnabled = true
