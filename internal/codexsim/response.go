package codexsim

import (
	"context"
	"encoding/base64"
	"fmt"
	"time"
)

// response is one response.create being answered, on a goroutine owned by
// its session.
type response struct {
	ss   *session
	cfg  Config
	req  *createRequest
	plan *plan         // nil for a prewarm
	prev *heldResponse // the continued response, nil on a fresh chain
	id   string

	seq       int
	createdAt int64
	output    []obj  // finished output items
	reasoning []bool // reasoning[i]: output[i] is a reasoning item
}

// sleep waits d or until ctx ends; it reports whether to go on.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// stamp adds the sequence_number to e, after the inter-event delay.
func (r *response) stamp(ctx context.Context, e obj) (obj, bool) {
	if r.seq > 0 && !sleep(ctx, r.cfg.Faults.InterEventDelay) {
		return nil, false
	}
	e = append(e, field{"sequence_number", r.seq})
	r.seq++
	return e, true
}

// emit sends one event of the response.
func (r *response) emit(ctx context.Context, e obj) bool {
	e, ok := r.stamp(ctx, e)
	if !ok {
		return false
	}
	r.ss.sendMu.Lock()
	defer r.ss.sendMu.Unlock()
	return r.ss.sendLocked(ctx, e) == nil
}

// delta sends a delta event after the delta interval.
func (r *response) delta(ctx context.Context, e obj) bool {
	if !sleep(ctx, r.cfg.DeltaInterval) {
		return false
	}
	return r.emit(ctx, e)
}

// object is the response object carried by lifecycle events.
func (r *response) object(status string) obj {
	var prev any
	if r.req.PreviousResponseID != "" {
		prev = r.req.PreviousResponseID
	}
	return obj{
		{"id", r.id},
		{"object", "response"},
		{"created_at", r.createdAt},
		{"status", status},
		{"model", r.req.Model},
		{"previous_response_id", prev},
		{"store", false},
		{"output", []obj{}},
		{"error", nil},
		{"incomplete_details", nil},
		{"usage", nil},
	}
}

// rateLimits is the informational codex.rate_limits event: the account's
// windows now (Config.Quota).
func (r *response) rateLimits() obj {
	now := r.ss.s.clock()
	v := r.ss.s.usage.view(r.ss.account, r.cfg.Quota, now)
	window := func(w windowView) obj {
		resetAfter := int64(max(w.resetAt.Sub(now), 0) / time.Second)
		return obj{{"used_percent", w.used}, {"window_minutes", w.minutes}, {"reset_after_seconds", resetAfter}, {"reset_at", w.resetAt.Unix()}}
	}
	reached := v[0].used >= 100 || v[1].used >= 100
	return obj{
		{"type", "codex.rate_limits"},
		{"plan_type", r.cfg.Quota.Plan},
		{"rate_limits", obj{
			{"allowed", !reached},
			{"limit_reached", reached},
			{"primary", window(v[0])},
			{"secondary", window(v[1])},
		}},
		{"code_review_rate_limits", nil},
		{"additional_rate_limits", nil},
	}
}

// finish ends the in-flight period; a completed response becomes
// continuable. Callers hold sendMu while they send the terminal event, so
// the next response's events cannot overtake it.
func (r *response) finish(held *heldResponse) {
	ss := r.ss
	ss.mu.Lock()
	ss.inFlight = false
	if held != nil && (r.plan == nil || !r.plan.forget) {
		ss.held[r.id] = *held
	}
	ss.mu.Unlock()
}

// terminal ends the response and sends its last event.
func (r *response) terminal(ctx context.Context, e obj, held *heldResponse) {
	e, ok := r.stamp(ctx, e)
	if !ok {
		r.finish(nil)
		return
	}
	r.ss.sendMu.Lock()
	defer r.ss.sendMu.Unlock()
	r.finish(held)
	_ = r.ss.sendLocked(ctx, e)
}

// terminalFrame ends the response with an error frame (no sequence number).
func (r *response) terminalFrame(ctx context.Context, f obj) {
	r.ss.sendMu.Lock()
	defer r.ss.sendMu.Unlock()
	r.finish(nil)
	_ = r.ss.sendLocked(ctx, f)
}

// run answers the response.create.
func (r *response) run(ctx context.Context) {
	ended := false
	defer func() {
		if !ended {
			r.finish(nil)
		}
	}()
	p := r.plan
	var delay time.Duration
	if p != nil {
		delay = p.delay
	}
	if !sleep(ctx, delay+r.cfg.Faults.FirstByteDelay) {
		return
	}
	if p != nil && p.errCode != "" {
		e := &wireError{Status: p.errStatus, Type: errorType(p.errCode, p.errStatus), Code: p.errCode,
			Message: fmt.Sprintf("clodex-sim scripted error %s", p.errCode)}
		r.ss.s.count(func(st *Stats) { st.Errors[e.Code]++ })
		ended = true
		r.terminalFrame(ctx, e.frame())
		return
	}
	if p != nil && p.usageLimit {
		plan := p.usagePlan
		if plan == "" {
			plan = r.cfg.Faults.UsageLimitPlan
		}
		e := usageLimitError(plan, p.usageResetsIn, r.ss.s.clock())
		r.ss.s.count(func(st *Stats) { st.Errors[e.Code]++ })
		ended = true
		r.terminalFrame(ctx, e.frame())
		return
	}
	if !r.emit(ctx, r.rateLimits()) {
		return
	}
	r.createdAt = r.ss.s.clock().Unix()
	prewarm := !r.req.Generate
	if !prewarm {
		r.ss.s.usage.use(r.ss.account, r.cfg.Quota, r.ss.s.clock())
	}
	r.ss.s.count(func(st *Stats) {
		st.Responses++
		if prewarm {
			st.Prewarms++
		} else if r.prev != nil {
			st.ContinuedResponses++
		}
	})
	if !r.emit(ctx, obj{{"type", "response.created"}, {"response", r.object("in_progress")}}) {
		return
	}
	if r.cfg.Faults.Stall || (p != nil && p.stall) {
		<-ctx.Done()
		return
	}
	if prewarm {
		ended = true
		r.complete(ctx, "completed", "")
		return
	}
	if !r.emit(ctx, obj{{"type", "response.in_progress"}, {"response", r.object("in_progress")}}) {
		return
	}
	switch {
	case p.contextLength:
		ended = true
		r.fail(ctx, "context_length_exceeded", "invalid_request_error",
			"Your input exceeds the context window of this model. Please adjust your input and try again.")
		return
	case p.failCode != "":
		ended = true
		r.fail(ctx, p.failCode, errorType(p.failCode, 0), fmt.Sprintf("clodex-sim scripted failure %s", p.failCode))
		return
	case r.cfg.Faults.FailResponses != "":
		code := r.cfg.Faults.FailResponses
		ended = true
		r.fail(ctx, code, errorType(code, 0), fmt.Sprintf("clodex-sim injected failure %s", code))
		return
	}
	for _, parts := range p.reasoning {
		if !r.reasoningItem(ctx, parts) {
			return
		}
	}
	reply, calls := p.reply, p.calls
	if p.structured != nil {
		// Structured output: the JSON answer only, as strict mode gives.
		s := string(p.structured)
		reply, calls = &s, nil
	}
	if reply == nil && len(calls) == 0 && p.incomplete == "" {
		d := p.defaultReply()
		reply = &d
	}
	if reply != nil && !r.messageItem(ctx, *reply) {
		return
	}
	for _, c := range calls {
		if !r.callItem(ctx, c) {
			return
		}
	}
	ended = true
	if p.incomplete != "" {
		r.complete(ctx, "incomplete", p.incomplete)
		return
	}
	r.complete(ctx, "completed", "")
}

// errorType picks error.type for a code the way the real backend groups them.
func errorType(code string, status int) string {
	switch {
	case code == "usage_limit_reached" || code == "usage_not_included":
		return code
	case code == "insufficient_quota":
		return code
	case code == "rate_limit_exceeded" || status == 429:
		return "rate_limit_error"
	case code == "server_is_overloaded" || code == "slow_down" || code == "overloaded" || status == 503:
		return "service_unavailable_error"
	case code == "server_error" || code == "internal_server_error" || status >= 500:
		return "server_error"
	}
	return "invalid_request_error"
}

func (r *response) fail(ctx context.Context, code, typ, msg string) {
	o := r.object("failed").set("error", obj{{"type", typ}, {"code", code}, {"message", msg}})
	r.ss.s.count(func(st *Stats) { st.Errors[code]++ })
	r.terminal(ctx, obj{{"type", "response.failed"}, {"response", o}}, nil)
}

func (r *response) itemID(prefix string) string {
	return fmt.Sprintf("%s_%s_%d", prefix, r.id[len("resp_"):], len(r.output))
}

func (r *response) addItem(item obj, reasoning bool) {
	r.output = append(r.output, item)
	r.reasoning = append(r.reasoning, reasoning)
}

func (r *response) messageItem(ctx context.Context, text string) bool {
	idx := len(r.output)
	id := r.itemID("msg")
	if !r.emit(ctx, obj{{"type", "response.output_item.added"}, {"output_index", idx},
		{"item", obj{{"id", id}, {"type", "message"}, {"status", "in_progress"}, {"content", []any{}}, {"role", "assistant"}}}}) {
		return false
	}
	if !r.emit(ctx, obj{{"type", "response.content_part.added"}, {"item_id", id}, {"output_index", idx}, {"content_index", 0},
		{"part", obj{{"type", "output_text"}, {"annotations", []any{}}, {"text", ""}}}}) {
		return false
	}
	for _, d := range splitDeltas(text) {
		if !r.delta(ctx, obj{{"type", "response.output_text.delta"}, {"item_id", id}, {"output_index", idx}, {"content_index", 0}, {"delta", d}, {"logprobs", []any{}}}) {
			return false
		}
	}
	if !r.emit(ctx, obj{{"type", "response.output_text.done"}, {"item_id", id}, {"output_index", idx}, {"content_index", 0}, {"text", text}, {"logprobs", []any{}}}) {
		return false
	}
	part := obj{{"type", "output_text"}, {"annotations", []any{}}, {"text", text}}
	if !r.emit(ctx, obj{{"type", "response.content_part.done"}, {"item_id", id}, {"output_index", idx}, {"content_index", 0}, {"part", part}}) {
		return false
	}
	item := obj{{"id", id}, {"type", "message"}, {"status", "completed"}, {"content", []obj{part}}, {"role", "assistant"}}
	r.addItem(item, false)
	return r.emit(ctx, obj{{"type", "response.output_item.done"}, {"output_index", idx}, {"item", item}})
}

func (r *response) callItem(ctx context.Context, c plannedCall) bool {
	idx := len(r.output)
	id := r.itemID("fc")
	r.ss.mu.Lock()
	r.ss.nCalls++
	callID := fmt.Sprintf("call_%d", r.ss.nCalls)
	r.ss.mu.Unlock()
	if !r.emit(ctx, obj{{"type", "response.output_item.added"}, {"output_index", idx},
		{"item", obj{{"id", id}, {"type", "function_call"}, {"status", "in_progress"}, {"arguments", ""}, {"call_id", callID}, {"name", c.name}}}}) {
		return false
	}
	for _, d := range splitDeltas(c.args) {
		if !r.delta(ctx, obj{{"type", "response.function_call_arguments.delta"}, {"item_id", id}, {"output_index", idx}, {"delta", d}}) {
			return false
		}
	}
	if !r.emit(ctx, obj{{"type", "response.function_call_arguments.done"}, {"item_id", id}, {"output_index", idx}, {"name", c.name}, {"arguments", c.args}}) {
		return false
	}
	item := obj{{"id", id}, {"type", "function_call"}, {"status", "completed"}, {"arguments", c.args}, {"call_id", callID}, {"name", c.name}}
	r.addItem(item, false)
	return r.emit(ctx, obj{{"type", "response.output_item.done"}, {"output_index", idx}, {"item", item}})
}

func (r *response) reasoningItem(ctx context.Context, parts []string) bool {
	idx := len(r.output)
	id := r.itemID("rs")
	if !r.emit(ctx, obj{{"type", "response.output_item.added"}, {"output_index", idx},
		{"item", obj{{"id", id}, {"type", "reasoning"}, {"summary", []any{}}}}}) {
		return false
	}
	summary := make([]obj, 0, len(parts))
	for i, text := range parts {
		if !r.emit(ctx, obj{{"type", "response.reasoning_summary_part.added"}, {"item_id", id}, {"output_index", idx}, {"summary_index", i},
			{"part", obj{{"type", "summary_text"}, {"text", ""}}}}) {
			return false
		}
		for _, d := range splitDeltas(text) {
			if !r.delta(ctx, obj{{"type", "response.reasoning_summary_text.delta"}, {"item_id", id}, {"output_index", idx}, {"summary_index", i}, {"delta", d}}) {
				return false
			}
		}
		if !r.emit(ctx, obj{{"type", "response.reasoning_summary_text.done"}, {"item_id", id}, {"output_index", idx}, {"summary_index", i}, {"text", text}}) {
			return false
		}
		part := obj{{"type", "summary_text"}, {"text", text}}
		if !r.emit(ctx, obj{{"type", "response.reasoning_summary_part.done"}, {"item_id", id}, {"output_index", idx}, {"summary_index", i}, {"part", part}}) {
			return false
		}
		summary = append(summary, part)
	}
	item := obj{{"id", id}, {"type", "reasoning"}, {"summary", summary}, {"encrypted_content", EncryptedContent(r.id, idx)}}
	r.addItem(item, true)
	return r.emit(ctx, obj{{"type", "response.output_item.done"}, {"output_index", idx}, {"item", item}})
}

// EncryptedContent is the deterministic encrypted_content blob of the
// reasoning item at output index idx of response responseID:
// base64("sim-reasoning:" + responseID + ":" + idx).
func EncryptedContent(responseID string, idx int) string {
	return base64.StdEncoding.EncodeToString(fmt.Appendf(nil, "sim-reasoning:%s:%d", responseID, idx))
}

// complete sends response.completed (status "completed") or
// response.incomplete, with usage, and holds a completed response.
func (r *response) complete(ctx context.Context, status, reason string) {
	items, fixed := promptTokens(r.req)
	var prevChain, cached int64
	if r.prev != nil {
		prevChain = r.prev.chainItems
		cached = r.prev.inputTokens + r.prev.outputTokens
	}
	var outTokens, reasoningTokens int64
	for i, it := range r.output {
		n := tokensOf(appendJSON(nil, it))
		outTokens += n
		if r.reasoning[i] {
			reasoningTokens += n
		}
	}
	input := prevChain + items + fixed
	cached = min(cached, input)
	output := r.output
	if output == nil {
		output = []obj{}
	}
	o := r.object(status).set("output", output).set("usage", obj{
		{"input_tokens", input},
		{"input_tokens_details", obj{{"cached_tokens", cached}}},
		{"output_tokens", outTokens},
		{"output_tokens_details", obj{{"reasoning_tokens", reasoningTokens}}},
		{"total_tokens", input + outTokens},
	})
	typ := "response.completed"
	var held *heldResponse
	if status == "incomplete" {
		typ = "response.incomplete"
		o = o.set("incomplete_details", obj{{"reason", reason}})
	} else {
		held = &heldResponse{inputTokens: input, outputTokens: outTokens, chainItems: prevChain + items + outTokens}
	}
	r.ss.s.count(func(st *Stats) {
		st.InputTokens += input
		st.CachedTokens += cached
		st.OutputTokens += outTokens
		u := st.UsageByAccount[r.ss.account]
		u.InputTokens += input
		u.CachedTokens += cached
		u.OutputTokens += outTokens
		if held != nil {
			st.CompletedResponses++
			u.CompletedResponses++
		}
		st.UsageByAccount[r.ss.account] = u
	})
	r.terminal(ctx, obj{{"type", typ}, {"response", o}}, held)
}
