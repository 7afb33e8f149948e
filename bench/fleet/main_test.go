package main

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/bench/fleet/cluster"
)

func TestParseFlagsRejectsBadInput(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want []string // substrings of the one error
	}{
		{"unknown configuration", []string{"--configs", "central,bogus"}, []string{`--configs: unknown configuration "bogus"`, "allowed central,per-host,central-kill,replicas-kill,replicas-2x2"}},
		{"empty configurations", []string{"--configs", ","}, []string{"--configs is empty"}},
		{"rate out of range", []string{"--rate", "601"}, []string{"--rate 601 is out of range; allowed 1..600"}},
		{"several problems at once", []string{"--dataplanes", "0", "--agents", "500"}, []string{"--dataplanes 0", "--agents 500", "allowed 1..200"}},
		{"outage past the run", []string{"--duration", "30s", "--kill-at", "20s", "--kill-for", "20s"}, []string{"--kill-at 20s and --kill-for 20s must be positive and end before --duration 30s"}},
		{"short timeout", []string{"--timeout", "1s"}, []string{"--timeout 1s is out of range"}},
		{"positional argument", []string{"central"}, []string{`unexpected argument "central"`}},
		{"unknown flag", []string{"--nope"}, []string{"flag provided but not defined: -nope"}},
		{"bad duration", []string{"--duration", "soon"}, []string{`invalid value "soon" for flag -duration`}},
		{"fractional duration", []string{"--duration", "60500ms"}, []string{"--duration 1m0.5s must be whole seconds"}},
		{"accuracy out of range", []string{"--accuracy-dataplanes", "0", "--accuracy-rate", "0", "--accuracy-burst", "1001"},
			[]string{"--accuracy-dataplanes 0", "--accuracy-rate 0", "--accuracy-burst 1001"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseFlags(tt.args, io.Discard)
			var u *usageError
			if !errors.As(err, &u) {
				t.Fatalf("parseFlags(%q) = %v, want a usage error", tt.args, err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("parseFlags(%q) = %q, want it to contain %q", tt.args, err, w)
				}
			}
		})
	}
}

func TestParseFlagsDefaultsAreTheIssueScenario(t *testing.T) {
	c, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// The benchmark's shape: 3 data planes, 20 agents each, 120/min burst 5
	// against 30 per 10 s, about a minute, a 20 s outage mid-run.
	if c.dataPlanes != 3 || c.agents != 20 || c.rate != 120 || c.burst != 5 || c.upgradeLimit != 30 ||
		c.upgradeWindow != 10*time.Second || c.duration != time.Minute || c.killFor != 20*time.Second {
		t.Errorf("defaults = %+v, want 3 data planes x 20 agents, 120/min burst 5, 30 per 10s, 1m, 20s outage", c)
	}
	var names []string
	for _, s := range c.configs {
		names = append(names, s.name)
	}
	const want = "central,per-host,central-kill,replicas-kill,replicas-2x2,central-adaptive-off,learned-1,learned-off-1,learned-3,learned-off-3"
	if got := strings.Join(names, ","); got != want {
		t.Errorf("default configurations = %s, want %s", got, want)
	}
	// The learned throttle's fan-out: 30 conversations against 20
	// upgrades per 60 s.
	if c.fanOut != 30 || c.fanOutLimit != 20 || c.fanOutWindow != time.Minute {
		t.Errorf("fan-out defaults = %d conversations against %d per %v; want 30 against 20 per 1m", c.fanOut, c.fanOutLimit, c.fanOutWindow)
	}
	// The replicas' accuracy run: 2 data planes on a hot account at
	// 30/min burst 5.
	if c.accDataPlanes != 2 || c.accRate != 30 || c.accBurst != 5 {
		t.Errorf("accuracy defaults = %d data planes, %d/min burst %d; want 2, 30, 5", c.accDataPlanes, c.accRate, c.accBurst)
	}
}

func TestRunWithoutBinariesSaysWhatIsMissing(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run(t.Context(), []string{"--bin", t.TempDir()}, &out, &errOut)
	var u *usageError
	if !errors.As(err, &u) || !strings.Contains(err.Error(), "clodex-dataplane") || !strings.Contains(err.Error(), "make build") {
		t.Errorf("run with an empty --bin = %v, want a usage error naming the missing binaries and make build", err)
	}
}

func TestPrintTable(t *testing.T) {
	cfg := &config{upgradeWindow: 10 * time.Second, upgradeLimit: 30}
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	outs := []outcome{
		{sc: scenarios[0], upgrades: 120, limit: 30, window: 10 * time.Second, load: cluster.LoadResult{OK: 118, Failed: 0, Elapsed: time.Minute, Retries: 7,
			Latencies: []time.Duration{ms(100), ms(200), ms(300), ms(400)}}},
		{sc: scenarios[1], u403: 42, upgrades: 180, maxWin: 30, limit: 30, window: 10 * time.Second, load: cluster.LoadResult{OK: 170, Failed: 3, Unfinished: 2,
			Elapsed: 2 * time.Minute, Latencies: []time.Duration{ms(15000)}, Reasons: map[string]int{"status 500": 3}}},
		{sc: scenarios[2], err: errors.New("boom")},
		{sc: scenarios[4], upgrades: 36, maxWin: 35, limit: 100000, window: time.Minute, load: cluster.LoadResult{Elapsed: time.Minute},
			accMet: true, accNote: "at most 35 upgrades in any 1m0s window"},
	}
	var b bytes.Buffer
	printTable(&b, cfg, outs)
	got := b.String()
	for _, want := range []string{
		"central-kill          replicas-2x2",
		"upstream 403s",
		"admitted new sockets/min",
		"120.0", // 120 upgrades in one minute
		"90.0",  // 180 upgrades in two minutes
		"max upgrades in one throttle window",
		"30 (30 per 10s)",
		"35 (100000 per 1m0s)",
		"replicas-2x2: at most 35 upgrades in any 1m0s window: met",
		"p50 turn latency",
		"200ms", // nearest-rank p50 of 100..400 ms
		"15.0s",
		"error",
		"per-host failed turns: status 500 x3",
		"central target (0 upstream 403s, 0 failed turns): met",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
}

func TestPrintTableTargetNotMet(t *testing.T) {
	var b bytes.Buffer
	printTable(&b, &config{}, []outcome{{sc: scenarios[0], u403: 1, load: cluster.LoadResult{Elapsed: time.Minute}}})
	if want := "central target (0 upstream 403s, 0 failed turns): NOT met"; !strings.Contains(b.String(), want) {
		t.Errorf("table lacks %q:\n%s", want, b.String())
	}
}

func TestCount403(t *testing.T) {
	s := []sample{{0, 0}, {time.Second, 0}, {2 * time.Second, 5}, {3 * time.Second, 9}, {4 * time.Second, 9}}
	tests := []struct {
		from, to time.Duration
		want     int64
	}{
		{0, 1500 * time.Millisecond, 0},
		{1500 * time.Millisecond, 3500 * time.Millisecond, 9},
		{2500 * time.Millisecond, time.Hour, 4},
		{0, time.Hour, 9},
	}
	for _, tt := range tests {
		if got := count403(s, tt.from, tt.to); got != tt.want {
			t.Errorf("count403(%v, %v) = %d, want %d", tt.from, tt.to, got, tt.want)
		}
	}
}
