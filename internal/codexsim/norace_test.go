//go:build !race

package codexsim

const raceEnabled = false
