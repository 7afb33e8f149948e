package translate

import (
	"encoding/json"
	"reflect"
	"strconv"
)

// The backend's events as the data plane reads them: upEvent, upItem and
// upResponse are the fields of a Responses event that Stream.Handle
// uses. (The codex.rate_limits side event the Stream ignores is read by
// dataplane/accounts.)

// upEvent is one upstream event (one WebSocket frame).
type upEvent struct {
	Type         string          `json:"type"`
	OutputIndex  optInt          `json:"output_index"`
	SummaryIndex int             `json:"summary_index"`
	Delta        string          `json:"delta"` // a non-string delta fails decoding (a malformed event)
	Item         json.RawMessage `json:"item"`
	Response     json.RawMessage `json:"response"`
}

// index is the event's output_index, -1 when absent or negative.
func (ev *upEvent) index() int {
	if !ev.OutputIndex.ok || ev.OutputIndex.v < 0 {
		return -1
	}
	return ev.OutputIndex.v
}

func (ev *upEvent) delta() (string, error) { return ev.Delta, nil }

// optInt is an integer that remembers whether it was present.
type optInt struct {
	v  int
	ok bool
}

func (o *optInt) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	n, err := strconv.Atoi(string(b))
	if err != nil {
		return &json.UnmarshalTypeError{Value: "number " + bounded(string(b)), Type: reflect.TypeFor[int]()}
	}
	o.v, o.ok = n, true
	return nil
}

// upItem is an output item (output_item.added and .done, response.output).
type upItem struct {
	Type             string  `json:"type"`
	ID               string  `json:"id"`
	CallID           string  `json:"call_id"`
	Name             string  `json:"name"`
	Arguments        string  `json:"arguments"`
	EncryptedContent *string `json:"encrypted_content"`
	Summary          []struct {
		Text string `json:"text"`
	} `json:"summary"`
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
}

// upResponse is the response of a terminal event.
type upResponse struct {
	ID     string            `json:"id"`
	Output []json.RawMessage `json:"output"`
	Usage  *struct {
		InputTokens        int `json:"input_tokens"`
		InputTokensDetails struct {
			CachedTokens     int `json:"cached_tokens"`
			CacheWriteTokens int `json:"cache_write_tokens"`
		} `json:"input_tokens_details"`
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
}
