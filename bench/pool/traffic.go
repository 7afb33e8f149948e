package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"text/tabwriter"

	"github.com/clodex/clodex/dataplane/pool"
)

// bytesResult sums what a conversation sent upstream.
type bytesResult struct {
	pooledIn, fullIn, pooledFrame, fullFrame int
	continuations, turns                     int
	inputTok, cachedTok                      int
}

// bytesRun runs one cc conversation of --bytes-turns turns (each adding a
// 2 KB tool result) and sums the input-item and whole-frame bytes sent,
// against resending the full history every turn.
func (b *bench) bytesRun(ctx context.Context) (bytesResult, error) {
	var res bytesResult
	if err := b.waitClosed(ctx); err != nil {
		return res, err
	}
	p, err := b.newPool()
	if err != nil {
		return res, err
	}
	defer p.Close()
	err = runConversation(ctx, p, b.tp, b.opts.account, "bytes-30-turn", b.opts.bytesTurns, func(t turnResult) {
		res.turns++
		if t.decision == pool.DecisionContinuation {
			res.continuations++
		}
		res.pooledIn += t.inputBytes
		res.fullIn += t.fullIn
		res.pooledFrame += t.frameBytes
		res.fullFrame += t.fullFrm
		res.inputTok += t.inputTok
		res.cachedTok += t.cachedToks
	})
	if err != nil {
		return res, err
	}
	if res.continuations != res.turns-1 {
		return res, fmt.Errorf("%d of %d turns continued a head; want every turn after the first", res.continuations, res.turns)
	}
	return res, nil
}

func pct(a, b int) float64 { return 100 * float64(a) / float64(b) }

func printBytes(w io.Writer, turns int, r bytesResult) {
	fmt.Fprintf(w, "\nUpstream bytes, one %d-turn Claude-Code-shaped conversation (2 KB tool result per turn), %d/%d turns continued (target: input items <= 10%%)\n", turns, r.continuations, r.turns)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tpooled (previous_response_id + new items)\tfull resend every turn\tratio\t")
	fmt.Fprintf(tw, "input-item bytes\t%d\t%d\t%.2f%%\t\n", r.pooledIn, r.fullIn, pct(r.pooledIn, r.fullIn))
	fmt.Fprintf(tw, "whole response.create frame bytes\t%d\t%d\t%.2f%%\t\n", r.pooledFrame, r.fullFrame, pct(r.pooledFrame, r.fullFrame))
	tw.Flush()
	fmt.Fprintf(w, "emulator usage over the conversation: %d input tokens, %d cached (%.1f%%)\n", r.inputTok, r.cachedTok, pct(r.cachedTok, r.inputTok))
}

// fanResult is one fan-out run.
type fanResult struct {
	turns                     int
	poolSockets, simUpgrades  uint64
	parallelHeads, savedSocks uint64
	continuations             uint64
}

// fanOut runs --agents subagents sharing one Claude Code session for
// --rounds rounds, every round fully in flight before any completes.
// closeParallel discards a parallel socket after its response, as the
// original design did.
func (b *bench) fanOut(ctx context.Context, closeParallel bool) (fanResult, error) {
	var res fanResult
	if err := b.waitClosed(ctx); err != nil {
		return res, err
	}
	p, err := b.newPool()
	if err != nil {
		return res, err
	}
	defer p.Close()
	sim0, err := b.simStats(ctx)
	if err != nil {
		return res, err
	}
	session := "fan-out-parent"
	if closeParallel {
		session = "fan-out-parent-closed"
	}
	agents, rounds := b.opts.agents, b.opts.rounds
	convs := make([]*conversation, agents)
	for a := range convs {
		convs[a] = b.tp.newConversation(session, fmt.Sprintf("Subagent %d: investigate package %d.\n%s", a, a, ccDirective(0, rounds)))
	}
	for r := range rounds {
		preps := make([]*prepared, agents)
		leases := make([]*pool.Lease, agents)
		for a, c := range convs {
			if preps[a], err = prepare(b.tp, c, b.opts.account); err != nil {
				return res, err
			}
			if leases[a], err = p.Acquire(ctx, preps[a].part, preps[a].items); err != nil {
				for _, l := range leases[:a] {
					l.Discard("benchmark failed")
				}
				return res, fmt.Errorf("round %d agent %d: acquire: %w", r+1, a, err)
			}
		}
		results := make([]turnResult, agents)
		errs := make([]error, agents)
		var wg sync.WaitGroup
		for a := range agents {
			wg.Go(func() {
				closeAfter := closeParallel && leases[a].Decision == pool.DecisionParallelHead
				results[a], errs[a] = drive(ctx, preps[a], leases[a], fmt.Sprintf("msg_fan_%d_%d", r, a), closeAfter)
			})
		}
		wg.Wait()
		for a, c := range convs {
			if errs[a] != nil {
				return res, fmt.Errorf("round %d agent %d: %w", r+1, a, errs[a])
			}
			res.turns++
			if r == rounds-1 {
				continue
			}
			if len(results[a].toolUses) == 0 {
				return res, fmt.Errorf("round %d agent %d: the response has no tool call; want the scripted Bash call", r+1, a)
			}
			blocks := make([]json.RawMessage, len(results[a].toolUses))
			for k, id := range results[a].toolUses {
				blocks[k] = toolResult(fmt.Sprint(a), r, id, ccDirective(r+1, rounds))
			}
			c.messages = append(c.messages, results[a].assistant, mustJSON(map[string]any{"role": "user", "content": blocks}))
		}
	}
	st := p.Stats()
	sim1, err := b.simStats(ctx)
	if err != nil {
		return res, err
	}
	res.poolSockets, res.simUpgrades = st.NewSockets, uint64(sim1.Upgrades-sim0.Upgrades)
	res.parallelHeads, res.savedSocks, res.continuations = st.ParallelHeads, st.SavedSockets, st.Continuations
	if res.poolSockets != res.simUpgrades {
		return res, fmt.Errorf("pool opened %d sockets but the emulator accepted %d upgrades", res.poolSockets, res.simUpgrades)
	}
	return res, nil
}

func printFanOut(w io.Writer, agents, rounds int, kept, closed fanResult) {
	fmt.Fprintf(w, "\nSubagent fan-out: %d subagents x %d rounds = %d turns, one session, every round fully in flight before any completes\n", agents, rounds, agents*rounds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tnew sockets (pool Stats)\tsim upgrades\tnew sockets per 100 turns\tcontinuations\tparallel heads\tsaved sockets\t")
	for _, r := range []struct {
		name string
		f    fanResult
	}{{"parallel heads kept (this pool)", kept}, {"parallel sockets closed (original)", closed}} {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%d\t%d\t%d\t\n", r.name, r.f.poolSockets, r.f.simUpgrades,
			100*float64(r.f.poolSockets)/float64(r.f.turns), r.f.continuations, r.f.parallelHeads, r.f.savedSocks)
	}
	tw.Flush()
}
