package pool

import (
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestMatchHeadProperties checks matchHead against the rule of docs/pool.md §3.2
// written out naively: P = requestInput ++ expectedAssistant matches when
// it is a strict prefix of F (exact); else, when the assistant part has
// reasoning items, P without them must be a strict prefix (omitted).
func TestMatchHeadProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		alphabet := []digest{{1}, {2}, {3}, {4}}
		gen := rapid.SliceOfN(rapid.SampledFrom(alphabet), 0, 8)
		input := gen.Draw(t, "input")
		if len(input) == 0 {
			input = []digest{{1}}
		}
		assistantPart := gen.Draw(t, "assistant")
		isR := rapid.SliceOfN(rapid.Bool(), len(assistantPart), len(assistantPart)).Draw(t, "reasoning")
		h := &head{nInput: int32(len(input)), digests: slices.Concat(input, assistantPart)}
		var without []digest
		for i, d := range assistantPart {
			if isR[i] {
				h.reasoning = append(h.reasoning, int32(len(input)+i))
			} else {
				without = append(without, d)
			}
		}
		pPrime := slices.Concat(input, without)
		// Build F either from P, from P', or at random.
		var full []digest
		switch rapid.IntRange(0, 2).Draw(t, "shape") {
		case 0:
			full = slices.Concat(h.digests, gen.Draw(t, "tail"))
		case 1:
			full = slices.Concat(pPrime, gen.Draw(t, "tail"))
		default:
			full = rapid.SliceOfN(rapid.SampledFrom(alphabet), 0, 20).Draw(t, "full")
		}
		strictPrefix := func(p []digest) bool {
			return len(full) > len(p) && slices.Equal(full[:len(p)], p)
		}
		mode, n := matchHead(h, full)
		switch {
		case strictPrefix(h.digests):
			if mode != modeExact || n != len(h.digests) {
				t.Fatalf("matchHead = %q %d, want exact %d", mode, n, len(h.digests))
			}
		case len(h.reasoning) > 0 && strictPrefix(pPrime):
			if mode != modeOmittedReasoning || n != len(pPrime) {
				t.Fatalf("matchHead = %q %d, want omitted_reasoning %d", mode, n, len(pPrime))
			}
		default:
			if mode != "" {
				t.Fatalf("matchHead = %q %d, want no match", mode, n)
			}
		}
	})
}
