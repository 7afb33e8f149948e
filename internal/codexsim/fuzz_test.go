package codexsim

import (
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/clodex/clodex/internal/captures"
)

// FuzzDecodeFrame: the frame decoder never panics, and every frame it
// refuses gets a well-formed error frame naming a code and a message.
func FuzzDecodeFrame(f *testing.F) {
	for _, name := range []string{"codex-0.171.0-apikey-websocket-session.json", "codex-0.171.0-chatgpt-websocket-session.json"} {
		b, err := captures.ReadFile(path.Join(fixtureDir, name))
		if err != nil {
			f.Fatal(err)
		}
		var session map[string]json.RawMessage
		if err := json.Unmarshal(b, &session); err != nil {
			f.Fatal(err)
		}
		for _, key := range []string{"frame_prewarm", "frame_turn", "frame_tool_output"} {
			var rec struct {
				Frame json.RawMessage `json:"frame"`
			}
			if err := json.Unmarshal(session[key], &rec); err != nil {
				f.Fatal(err)
			}
			f.Add([]byte(rec.Frame))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, werr := decodeFrame(data)
		if (req == nil) == (werr == nil) {
			t.Fatalf("decodeFrame returned req=%v err=%v; want exactly one", req, werr)
		}
		if werr == nil {
			if !json.Valid(data) {
				t.Fatalf("invalid JSON accepted: %q", data)
			}
			if strings.TrimSpace(req.Model) == "" {
				t.Fatalf("accepted a frame without a model: %q", data)
			}
			if req.Generate {
				text, tool := newestText(req.Input)
				if p, perr := parsePlan(text, tool); (p == nil) == (perr == nil) {
					t.Fatalf("parsePlan returned plan=%v err=%v", p, perr)
				} else if perr != nil {
					checkErrorFrame(t, perr)
				}
			}
			promptTokens(req)
			return
		}
		checkErrorFrame(t, werr)
	})
}

func checkErrorFrame(t *testing.T, e *wireError) {
	t.Helper()
	b, err := json.Marshal(e.frame())
	if err != nil {
		t.Fatalf("error frame does not encode: %v", err)
	}
	var f struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
		Error  struct {
			Type, Code, Message string
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("error frame is not JSON: %v", err)
	}
	if f.Type != "error" || f.Status != 400 || f.Error.Code == "" || f.Error.Message == "" || f.Error.Type == "" {
		t.Fatalf("error frame %s lacks type, status, code or message", b)
	}
}

// TestSeedCorpusOverSocket sends every seed frame over a real socket: each
// gets an answer (an error frame or a finished response) and the socket
// stays open.
func TestSeedCorpusOverSocket(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzDecodeFrame")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, ts := testServer(t, Config{})
	c := mustDial(t, ts)
	for _, ent := range entries {
		b, err := os.ReadFile(filepath.Join(dir, ent.Name()))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.SplitN(string(b), "\n", 3)
		if len(lines) < 2 || lines[0] != "go test fuzz v1" {
			t.Fatalf("%s is not a fuzz corpus file", ent.Name())
		}
		quoted := strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")")
		frame, err := strconv.Unquote(quoted)
		if err != nil {
			t.Fatalf("%s: %v", ent.Name(), err)
		}
		send(t, c, []byte(frame))
		evs := readResponse(t, c)
		if e := last(evs); e["type"] == "error" {
			if er := errorOf(t, e); er["code"] == "" || er["message"] == "" {
				t.Errorf("%s: error frame %v lacks code or message", ent.Name(), e)
			}
		}
	}
	send(t, c, create("#sim reply still open", nil))
	if evs := readResponse(t, c); last(evs)["type"] != "response.completed" {
		t.Fatalf("after the corpus: %v", last(evs))
	}
}
