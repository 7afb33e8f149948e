//go:build race

package codexsim

// raceEnabled reports a -race build, where multi-megabyte frames take tens
// of seconds on a small machine.
const raceEnabled = true
