package translate

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/clodex/clodex/dataplane/retry"
	"github.com/clodex/clodex/internal/jsonstr"
)

// EventWriter receives downstream Anthropic SSE events: an SSE writes them
// to the client, a Collector builds the non-streaming Message from them.
// data is only valid during the call.
type EventWriter interface {
	WriteEvent(name string, data []byte) error
}

// State is the state of a Stream after an upstream event.
type State int

const (
	StateRunning   State = iota // more events are expected
	StateCompleted              // the response completed; call Finish
	StateFailed                 // the response failed; see Failure
)

func (s State) String() string {
	switch s {
	case StateRunning:
		return "running"
	case StateCompleted:
		return "completed"
	case StateFailed:
		return "failed"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Usage is the Anthropic usage mapped from the Responses usage (docs/translation.md §9.3).
type Usage struct {
	InputTokens              int // input tokens excluding cached and cache-write tokens
	CacheReadInputTokens     int
	CacheCreationInputTokens int
	OutputTokens             int
}

// PingInterval is how often the gateway should call Stream.Ping while the
// upstream works without producing downstream output (docs/translation.md §9.5).
const PingInterval = 20 * time.Second

// Stream turns the events of one upstream response into Anthropic SSE
// events (docs/translation.md §9). It is a state machine fed by Handle; it does no
// I/O beyond calling its EventWriter and is not safe for concurrent use.
type Stream struct {
	turn  *Turn
	w     EventWriter
	sse   *SSE // w when the stream flushes per upstream event (NewSSEStream), else nil
	msgID string

	started    bool // message_start written (by this stream or the one it resumes)
	committed  bool // anything written by this stream
	delivered  bool // a delta (or message_delta) written: content the client keeps
	toolOpened bool // a tool_use block was opened: the client would run the call
	state      State
	failure    *retry.UpstreamError
	responseID string
	nextIndex  int
	open       *itemState // item whose block is open (nil when none)
	openKind   string     // kind of the open block
	openIndex  int
	// unshown is a reasoning item that ended with a signature and no
	// summary text: its thinking block is written just before the next
	// block or the end, so a failure before then leaves no block behind
	// (docs/translation.md §9.2).
	unshown    *itemState
	items      map[int]*itemState
	sawToolUse bool
	usage      Usage
	haveUsage  bool
	cached     int    // tokens of the input the socket already holds (SetCachedPrefix)
	incomplete string // incomplete_details.reason of a response.incomplete
	finished   bool
	output     []json.RawMessage // cached OutputItems

	buf []byte // scratch for event data
}

// itemState accumulates one output item.
type itemState struct {
	index     int
	typ       string
	callID    string
	name      string
	args      []byte
	text      []byte
	summaries [][]byte
	shownPart int // summary part of the latest thinking text written; -1 before any
	encrypted string
	done      json.RawMessage // the output_item.done item
	argsSent  bool
	opened    bool // a block was opened for this item
}

// NewStream starts translating one upstream response for t. messageID is
// the id of the downstream message (e.g. "msg_<epoch ms>").
func NewStream(t *Turn, w EventWriter, messageID string) *Stream {
	if t == nil {
		t = &Turn{}
	}
	return &Stream{turn: t, w: w, msgID: messageID, items: map[int]*itemState{}}
}

// NewSSEStream is NewStream writing to sse, the events of each upstream
// event (Handle) and those of Finish flushed together.
func NewSSEStream(t *Turn, sse *SSE, messageID string) *Stream {
	s := NewStream(t, sse, messageID)
	s.sse = sse
	return s
}

var errMalformed = errors.New("malformed event")

// Handle consumes one upstream event (the JSON text of one WebSocket
// frame) and writes the Anthropic events it determines. Unknown event
// types, codex.* side events and sequence_number are ignored. The returned
// error is only ever a write error; upstream failures are reported as
// StateFailed with Failure set. After the stream reached StateCompleted
// or StateFailed further events are ignored.
func (s *Stream) Handle(event []byte) (State, error) {
	if s.sse == nil {
		return s.handle(event)
	}
	s.sse.beginBatch()
	state, err := s.handle(event)
	if ferr := s.sse.endBatch(); err == nil {
		err = ferr
	}
	return state, err
}

func (s *Stream) handle(event []byte) (State, error) {
	if s.state != StateRunning {
		return s.state, nil
	}
	var ev upEvent
	if jsonKind(event) != '{' {
		s.fail(retry.UnreadableEvent(""))
		return s.state, nil
	}
	if err := json.Unmarshal(event, &ev); err != nil {
		var te *json.UnmarshalTypeError
		if !errors.As(err, &te) || handled(ev.Type) {
			s.fail(retry.UnreadableEvent(""))
			return s.state, nil
		}
		return s.state, nil // a side event we do not read
	}
	err := s.dispatch(&ev, event)
	if errors.Is(err, errMalformed) {
		s.fail(retry.UnreadableEvent(ev.Type))
		return s.state, nil
	}
	return s.state, err
}

func (s *Stream) dispatch(ev *upEvent, raw []byte) error {
	switch ev.Type {
	case "response.created", "response.in_progress", "response.queued":
		var r struct {
			Response struct {
				ID string `json:"id"`
			} `json:"response"`
		}
		if json.Unmarshal(raw, &r) == nil && r.Response.ID != "" {
			s.responseID = r.Response.ID
		}
	case "response.output_item.added":
		return s.itemAdded(ev.index(), ev.Item)
	case "response.output_item.done":
		return s.itemDone(ev.index(), ev.Item)
	case "response.output_text.delta":
		d, err := ev.delta()
		if err != nil {
			return err
		}
		st := s.item(ev.index(), "message")
		st.text = append(st.text, d...)
		if d == "" {
			return nil
		}
		if err := s.ensureOpen(st, "text"); err != nil {
			return err
		}
		return s.writeDelta("text_delta", "text", d)
	case "response.reasoning_summary_part.added":
		// One thinking block per reasoning item: a new part is a new
		// paragraph of the same block (thinkingDelta).
	case "response.reasoning_summary_text.delta":
		d, err := ev.delta()
		if err != nil {
			return err
		}
		st := s.item(ev.index(), "reasoning")
		if ev.SummaryIndex < 0 || ev.SummaryIndex > 1024 {
			return errMalformed
		}
		for len(st.summaries) <= ev.SummaryIndex {
			st.summaries = append(st.summaries, nil)
		}
		st.summaries[ev.SummaryIndex] = append(st.summaries[ev.SummaryIndex], d...)
		return s.thinkingDelta(st, ev.SummaryIndex, d)
	case "response.function_call_arguments.delta":
		d, err := ev.delta()
		if err != nil {
			return err
		}
		st := s.item(ev.index(), "function_call")
		st.args = append(st.args, d...)
	case "response.completed", "response.done":
		return s.completed(ev.Response)
	case "response.incomplete":
		var r upResponse
		if len(ev.Response) > 0 && json.Unmarshal(ev.Response, &r) != nil {
			return errMalformed
		}
		if !s.committed {
			s.fail(retry.ClassifyFrame(raw, false))
			return nil
		}
		s.takeResponse(&r)
		if r.IncompleteDetails != nil {
			s.incomplete = r.IncompleteDetails.Reason
		}
		s.state = StateCompleted
	case "response.failed", "error":
		s.fail(retry.ClassifyFrame(raw, s.committed))
	}
	return nil
}

// item returns the state of the item at index, creating it with typ when
// it is new. Events without an output_index share the most recent item of
// that type.
func (s *Stream) item(index int, typ string) *itemState {
	if index < 0 {
		if s.open != nil && s.open.typ == typ {
			return s.open
		}
		index = len(s.items) + 1_000_000
	}
	st := s.items[index]
	if st == nil {
		st = &itemState{index: index, typ: typ, shownPart: -1}
		s.items[index] = st
	}
	return st
}

func blockKind(typ string) string {
	switch typ {
	case "reasoning":
		return "thinking"
	case "message":
		return "text"
	case "function_call":
		return "tool_use"
	}
	return ""
}

func (s *Stream) itemAdded(index int, raw json.RawMessage) error {
	var it upItem
	if json.Unmarshal(raw, &it) != nil {
		return errMalformed
	}
	st := s.item(index, it.Type)
	st.typ = it.Type
	if it.CallID != "" {
		st.callID = it.CallID
	}
	if it.Name != "" {
		st.name = it.Name
	}
	switch k := blockKind(it.Type); k {
	case "":
	case "thinking":
		// The block opens with its first text, or at the item's end
		// when it has none: a reasoning item that never gets that far
		// leaves no unsigned block behind. message_start goes out now, so
		// the client sees the response begin (and gets pings) while the
		// model reasons.
		return s.start()
	default:
		return s.openBlock(st, k)
	}
	return nil
}

// thinkingDelta writes text d of summary part part of the reasoning item
// st into its thinking block, opening it if needed. Parts are paragraphs
// of one block: the first text of a later part is preceded by a blank
// line (docs/translation.md §9.2).
func (s *Stream) thinkingDelta(st *itemState, part int, d string) error {
	if d == "" {
		return nil
	}
	if st.shownPart >= 0 && part != st.shownPart {
		d = "\n\n" + d
	}
	st.shownPart = part
	if err := s.ensureOpen(st, "thinking"); err != nil {
		return err
	}
	return s.writeDelta("thinking_delta", "thinking", d)
}

func (s *Stream) itemDone(index int, raw json.RawMessage) error {
	var it upItem
	if json.Unmarshal(raw, &it) != nil {
		return errMalformed
	}
	st := s.item(index, it.Type)
	st.typ = it.Type
	st.done = raw
	if it.CallID != "" {
		st.callID = it.CallID
	}
	if it.Name != "" {
		st.name = it.Name
	}
	switch it.Type {
	case "reasoning":
		if it.EncryptedContent != nil {
			st.encrypted = *it.EncryptedContent
		}
		if st.shownPart < 0 {
			// Nothing was streamed: the summary of the done item.
			for i, p := range it.Summary {
				if err := s.thinkingDelta(st, i, p.Text); err != nil {
					return err
				}
			}
		}
		if st.shownPart < 0 && st.encrypted != "" && s.open != st {
			s.unshown = st // a signature alone: written before what follows
		}
	case "message":
		if len(st.text) > 0 {
			return nil
		}
		var t strings.Builder
		for _, c := range it.Content {
			if c.Type == "output_text" {
				t.WriteString(c.Text)
			}
		}
		if t.Len() == 0 && st.opened {
			return nil
		}
		st.text = []byte(t.String())
		if err := s.ensureOpen(st, "text"); err != nil {
			return err
		}
		if t.Len() > 0 {
			return s.writeDelta("text_delta", "text", t.String())
		}
	case "function_call":
		if it.Arguments != "" || len(st.args) == 0 {
			st.args = []byte(it.Arguments)
		}
		if err := s.ensureOpen(st, "tool_use"); err != nil {
			return err
		}
		s.sawToolUse = true
		if s.open == st && !st.argsSent {
			st.argsSent = true
			args := sanitizeArguments(string(st.args), s.turn.required[st.name])
			return s.writeDelta("input_json_delta", "partial_json", args)
		}
	}
	return nil
}

func (s *Stream) completed(resp json.RawMessage) error {
	var r upResponse
	if len(resp) > 0 && json.Unmarshal(resp, &r) != nil {
		return errMalformed
	}
	if len(s.items) == 0 {
		// Nothing was streamed: fall back to response.output (docs/translation.md §9.3).
		for i, it := range r.Output {
			if err := s.itemAdded(i, it); err != nil {
				return err
			}
			if err := s.itemDone(i, it); err != nil {
				return err
			}
		}
	}
	if !s.committed {
		// Never an empty 200: a response with no output is a failure.
		s.fail(retry.NewUpstreamError(502, "", "OpenAI ended the response with no output (response.completed)"))
		return nil
	}
	s.takeResponse(&r)
	s.state = StateCompleted
	return nil
}

func (s *Stream) takeResponse(r *upResponse) {
	if r.ID != "" {
		s.responseID = r.ID
	}
	if u := r.Usage; u != nil {
		c, w := u.InputTokensDetails.CachedTokens, u.InputTokensDetails.CacheWriteTokens
		s.usage = Usage{
			InputTokens:              max(0, u.InputTokens-c-w),
			CacheReadInputTokens:     c,
			CacheCreationInputTokens: w,
			OutputTokens:             u.OutputTokens,
		}
		s.haveUsage = true
	}
}

// ensureOpen opens a block of kind for st unless one is already open.
func (s *Stream) ensureOpen(st *itemState, kind string) error {
	if s.open == st && s.openKind == kind {
		return nil
	}
	return s.openBlock(st, kind)
}

func (s *Stream) openBlock(st *itemState, kind string) error {
	if u := s.unshown; u != nil {
		s.unshown = nil
		if u != st {
			if err := s.openBlock(u, "thinking"); err != nil {
				return err
			}
		}
	}
	if err := s.closeBlock(); err != nil {
		return err
	}
	if err := s.start(); err != nil {
		return err
	}
	idx := s.nextIndex
	s.nextIndex++
	b := append(s.buf[:0], `{"type":"content_block_start","index":`...)
	b = appendInt(b, idx)
	switch kind {
	case "thinking":
		b = append(b, `,"content_block":{"type":"thinking","thinking":"","signature":""}}`...)
	case "text":
		b = append(b, `,"content_block":{"type":"text","text":""}}`...)
	case "tool_use":
		b = append(b, `,"content_block":{"type":"tool_use","id":`...)
		b = jsonstr.Append(b, st.callID)
		b = append(b, `,"name":`...)
		b = jsonstr.Append(b, st.name)
		b = append(b, `,"input":{}}}`...)
	}
	s.buf = b
	s.open, s.openKind, s.openIndex = st, kind, idx
	st.opened = true
	if kind == "tool_use" {
		s.toolOpened = true
	}
	return s.write("content_block_start", b)
}

func (s *Stream) closeBlock() error {
	st := s.open
	if st == nil {
		return nil
	}
	switch s.openKind {
	case "thinking":
		sig := st.encrypted
		if sig == "" {
			sig = UnsignedThinking // never an empty signature
		}
		if err := s.writeDelta("signature_delta", "signature", sig); err != nil {
			return err
		}
	case "tool_use":
		if !st.argsSent && len(st.args) > 0 {
			st.argsSent = true
			if err := s.writeDelta("input_json_delta", "partial_json", string(st.args)); err != nil {
				return err
			}
		}
	}
	s.open = nil
	b := append(s.buf[:0], `{"type":"content_block_stop","index":`...)
	b = appendInt(b, s.openIndex)
	b = append(b, '}')
	s.buf = b
	return s.write("content_block_stop", b)
}

func (s *Stream) writeDelta(deltaType, field, value string) error {
	s.delivered = true
	b := append(s.buf[:0], `{"type":"content_block_delta","index":`...)
	b = appendInt(b, s.openIndex)
	b = append(b, `,"delta":{"type":"`...)
	b = append(b, deltaType...)
	b = append(b, `","`...)
	b = append(b, field...)
	b = append(b, `":`...)
	b = jsonstr.Append(b, value)
	b = append(b, `}}`...)
	s.buf = b
	return s.write("content_block_delta", b)
}

// start writes message_start once.
func (s *Stream) start() error {
	if s.started {
		return nil
	}
	s.started = true
	b := append(s.buf[:0], `{"type":"message_start","message":{"id":`...)
	b = jsonstr.Append(b, s.msgID)
	b = append(b, `,"type":"message","role":"assistant","content":[],"model":`...)
	b = jsonstr.Append(b, s.turn.RequestedModel)
	u := s.StartUsage()
	b = append(b, `,"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":`...)
	b = appendInt(b, u.InputTokens)
	b = append(b, `,"output_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":`...)
	b = appendInt(b, u.CacheReadInputTokens)
	b = append(b, `}}}`...)
	s.buf = b
	return s.write("message_start", b)
}

func (s *Stream) write(name string, data []byte) error {
	s.committed = true
	if s.w == nil {
		return nil
	}
	if err := s.w.WriteEvent(name, data); err != nil {
		return fmt.Errorf("write %s event: %w", name, err)
	}
	return nil
}

// Committed reports whether anything was written downstream. Before that a
// failure can still be answered with a real HTTP status.
func (s *Stream) Committed() bool { return s.committed }

// ResponseID is the upstream response id (from response.created or the
// terminal event), "" if none arrived.
func (s *Stream) ResponseID() string { return s.responseID }

// StopReason is the stop_reason Finish sends: max_tokens for a response
// cut by max_output_tokens, tool_use when a tool call completed, else
// end_turn (docs/translation.md §9.3).
func (s *Stream) StopReason() string {
	switch {
	case s.incomplete == "max_output_tokens":
		return "max_tokens"
	case s.sawToolUse:
		return "tool_use"
	}
	return "end_turn"
}

// Usage is the mapped usage (docs/translation.md §9.3). When upstream reported no input
// tokens at all, InputTokens is the local estimate of the request.
func (s *Stream) Usage() Usage {
	u := s.usage
	if u.InputTokens+u.CacheReadInputTokens+u.CacheCreationInputTokens == 0 {
		u.InputTokens = s.turn.EstimatedInputTokens
		u.CacheReadInputTokens, u.CacheCreationInputTokens = 0, 0
	}
	return u
}

// BackendUsage is the usage the backend reported with the response (its
// response.completed or response.incomplete), mapped as Usage maps it but
// never estimated; false when it reported none.
func (s *Stream) BackendUsage() (Usage, bool) { return s.usage, s.haveUsage }

// SetCachedPrefix tells the stream how many tokens of the request's input
// the socket already holds: on a continuation, the conversation it
// continues as the backend counted it (pool.Lease.CachedTokens); 0 on a
// new socket. Only message_start reads it.
func (s *Stream) SetCachedPrefix(tokens int) { s.cached = max(tokens, 0) }

// StartUsage is the usage message_start carries, before the backend has
// counted anything (docs/translation.md §9.3): the request's count_tokens
// estimate, of which the cached prefix (at most the whole estimate) is
// cache_read_input_tokens and the rest input_tokens; no output yet.
// Clients that read input and cache figures only from message_start
// (LangChain) see the turn's size; message_delta then carries the
// backend's exact figures.
func (s *Stream) StartUsage() Usage {
	est := max(s.turn.EstimatedInputTokens, 0)
	cached := min(s.cached, est)
	return Usage{InputTokens: est - cached, CacheReadInputTokens: cached}
}

var errNotCompleted = errors.New("finish stream: the response has not completed")

// Finish ends a completed response: it closes the open block and writes
// message_delta (stop_reason and usage) and message_stop.
func (s *Stream) Finish() error {
	if s.sse == nil {
		return s.finish()
	}
	s.sse.beginBatch() // the closing events go out in one flush
	err := s.finish()
	if ferr := s.sse.endBatch(); err == nil {
		err = ferr
	}
	return err
}

func (s *Stream) finish() error {
	if s.state != StateCompleted {
		return errNotCompleted
	}
	if s.finished {
		return nil
	}
	s.finished = true
	if err := s.start(); err != nil {
		return err
	}
	if u := s.unshown; u != nil {
		if err := s.openBlock(u, "thinking"); err != nil {
			return err
		}
	}
	if err := s.closeBlock(); err != nil {
		return err
	}
	u := s.Usage()
	b := append(s.buf[:0], `{"type":"message_delta","delta":{"stop_reason":"`...)
	b = append(b, s.StopReason()...)
	b = append(b, `","stop_sequence":null},"usage":{"input_tokens":`...)
	b = appendInt(b, u.InputTokens)
	b = append(b, `,"output_tokens":`...)
	b = appendInt(b, u.OutputTokens)
	b = append(b, `,"cache_creation_input_tokens":`...)
	b = appendInt(b, u.CacheCreationInputTokens)
	b = append(b, `,"cache_read_input_tokens":`...)
	b = appendInt(b, u.CacheReadInputTokens)
	b = append(b, `}}`...)
	s.buf = b
	if err := s.write("message_delta", b); err != nil {
		return err
	}
	return s.write("message_stop", []byte(`{"type":"message_stop"}`))
}

// Ping writes a ping event when the response is already committed and
// reports whether it wrote one. Before anything was written it does
// nothing, so a later failure can still get a real HTTP status.
func (s *Stream) Ping() (bool, error) {
	if !(s.committed || s.started) || s.finished {
		return false, nil
	}
	return true, s.write("ping", []byte(`{"type":"ping"}`))
}
