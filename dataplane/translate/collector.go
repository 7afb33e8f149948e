package translate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/clodex/clodex/internal/jsonstr"
)

// Collector is an EventWriter that builds the non-streaming Message JSON
// from the events a Stream writes (docs/translation.md §11): thinking
// blocks are kept with their signature, as Claude Code replays them in the
// tool loop, and stop_reason is max_tokens for a response cut short. Empty
// text blocks are left out. It is not safe for concurrent use.
type Collector struct {
	id, model  string
	blocks     []*collected
	open       map[int]*collected
	stopReason string
	usage      json.RawMessage
	stopped    bool
	errBody    json.RawMessage
}

type collected struct {
	typ       string
	text      bytes.Buffer // text, thinking, or tool input JSON
	signature string
	id, name  string
}

// NewCollector returns an empty Collector.
func NewCollector() *Collector { return &Collector{open: map[int]*collected{}} }

type sseEvent struct {
	Type    string `json:"type"`
	Index   int    `json:"index"`
	Message struct {
		ID    string `json:"id"`
		Model string `json:"model"`
	} `json:"message"`
	ContentBlock struct {
		Type string `json:"type"`
		ID   string `json:"id"`
		Name string `json:"name"`
	} `json:"content_block"`
	Delta struct {
		Type        string  `json:"type"`
		Text        string  `json:"text"`
		Thinking    string  `json:"thinking"`
		Signature   string  `json:"signature"`
		PartialJSON string  `json:"partial_json"`
		StopReason  *string `json:"stop_reason"`
	} `json:"delta"`
	Usage json.RawMessage `json:"usage"`
}

// WriteEvent records one Anthropic SSE event.
func (c *Collector) WriteEvent(name string, data []byte) error {
	if name == "ping" {
		return nil
	}
	if name == "error" {
		c.errBody = append(json.RawMessage(nil), data...)
		return nil
	}
	var ev sseEvent
	if err := json.Unmarshal(data, &ev); err != nil {
		return fmt.Errorf("collect %s event: %w", name, err)
	}
	switch name {
	case "message_start":
		c.id, c.model = ev.Message.ID, ev.Message.Model
	case "content_block_start":
		b := &collected{typ: ev.ContentBlock.Type, id: ev.ContentBlock.ID, name: ev.ContentBlock.Name}
		c.blocks = append(c.blocks, b)
		c.open[ev.Index] = b
	case "content_block_delta":
		b := c.open[ev.Index]
		if b == nil {
			return fmt.Errorf("collect delta: no open block %d", ev.Index)
		}
		switch ev.Delta.Type {
		case "text_delta":
			b.text.WriteString(ev.Delta.Text)
		case "thinking_delta":
			b.text.WriteString(ev.Delta.Thinking)
		case "signature_delta":
			b.signature = ev.Delta.Signature
		case "input_json_delta":
			b.text.WriteString(ev.Delta.PartialJSON)
		}
	case "content_block_stop":
		delete(c.open, ev.Index)
	case "message_delta":
		if ev.Delta.StopReason != nil {
			c.stopReason = *ev.Delta.StopReason
		}
		c.usage = append(json.RawMessage(nil), ev.Usage...)
	case "message_stop":
		c.stopped = true
	}
	return nil
}

// ErrCollectorIncomplete is returned by Message when the stream ended
// without message_stop.
var ErrCollectorIncomplete = errors.New("collect message: the response did not complete")

// Message returns the collected Message JSON. If the stream carried an
// error event, it returns an error holding that event's body; if it ended
// without message_stop, ErrCollectorIncomplete.
func (c *Collector) Message() ([]byte, error) {
	if c.errBody != nil {
		return nil, fmt.Errorf("collect message: stream failed: %s", c.errBody)
	}
	if !c.stopped {
		return nil, ErrCollectorIncomplete
	}
	b := []byte(`{"id":`)
	b = jsonstr.Append(b, c.id)
	b = append(b, `,"type":"message","role":"assistant","model":`...)
	b = jsonstr.Append(b, c.model)
	b = append(b, `,"content":[`...)
	n := 0
	for _, blk := range c.blocks {
		var part []byte
		switch blk.typ {
		case "text":
			if blk.text.Len() == 0 {
				continue
			}
			part = append(part, `{"type":"text","text":`...)
			part = jsonstr.Append(part, blk.text.String())
			part = append(part, '}')
		case "thinking":
			part = append(part, `{"type":"thinking","thinking":`...)
			part = jsonstr.Append(part, blk.text.String())
			part = append(part, `,"signature":`...)
			part = jsonstr.Append(part, blk.signature)
			part = append(part, '}')
		case "tool_use":
			input := bytes.TrimSpace(blk.text.Bytes())
			if len(input) == 0 || !json.Valid(input) || input[0] != '{' {
				input = []byte("{}")
			}
			part = append(part, `{"type":"tool_use","id":`...)
			part = jsonstr.Append(part, blk.id)
			part = append(part, `,"name":`...)
			part = jsonstr.Append(part, blk.name)
			part = append(part, `,"input":`...)
			part = append(part, compactJSON(input)...)
			part = append(part, '}')
		default:
			continue
		}
		if n > 0 {
			b = append(b, ',')
		}
		n++
		b = append(b, part...)
	}
	b = append(b, `],"stop_reason":`...)
	b = jsonstr.Append(b, c.stopReason)
	b = append(b, `,"stop_sequence":null,"usage":`...)
	if len(c.usage) == 0 {
		b = append(b, `{"input_tokens":0,"output_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}`...)
	} else {
		b = append(b, c.usage...)
	}
	return append(b, '}'), nil
}
