package translate

import (
	"errors"
	"strings"
	"testing"
)

// TestDecodeRefusesWhatUpstreamRejects: each request the upstream would
// certainly reject is refused while decoding, naming the field and what is
// allowed.
func TestDecodeRefusesWhatUpstreamRejects(t *testing.T) {
	const head = `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":`
	user := func(blocks string) string { return head + `[{"role":"user","content":[` + blocks + `]}]}` }
	pdf := `{"type":"base64","media_type":"application/pdf","data":"JVBERi0xLjQK"}`
	tests := []struct {
		name, body, field, msg string
	}{
		{"no messages", head + `[]}`, "messages", "at least one message"},
		{"empty user content", head + `[{"role":"user","content":[]}]}`, "messages[0].content", "at least one content block"},
		{"empty assistant content in the middle", head + `[{"role":"user","content":"a"},{"role":"assistant","content":[]},{"role":"user","content":"b"}]}`,
			"messages[1].content", "at least one content block"},
		{"empty system message", head + `[{"role":"system","content":[]},{"role":"user","content":"a"}]}`, "messages[0].content", "at least one content block"},
		{"unknown block type", user(`{"type":"container_upload","file_id":"f"}`), "messages[0].content[0].type",
			`"container_upload" cannot be sent to the OpenAI backend in user messages; allowed there: text, image, document, search_result, tool_result, tool_reference`},
		{"server tool block in assistant history", head + `[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"server_tool_use","id":"s","name":"web_search","input":{}}]}]}`,
			"messages[1].content[0].type", "allowed there: text, thinking, redacted_thinking, tool_use"},
		{"thinking in a user message", user(`{"type":"thinking","thinking":"x","signature":"s"}`), "messages[0].content[0].type", "in user messages"},
		{"image in a system message", head + `[{"role":"system","content":[{"type":"image","source":{"type":"url","url":"https://x/a.png"}}]}]}`,
			"messages[0].content[0].type", "in system messages; allowed there: text"},
		{"tool_use inside a tool result", user(`{"type":"tool_result","tool_use_id":"c","content":[{"type":"tool_use","id":"x","name":"n","input":{}}]}`),
			"messages[0].content[0].content[0].type", "in a tool_result's content; allowed there: text, image, document, search_result, tool_reference"},
		{"bmp image", user(`{"type":"image","source":{"type":"base64","media_type":"image/bmp","data":"Qk0="}}`), "messages[0].content[0].source.media_type",
			`image media type "image/bmp" cannot be sent to the OpenAI backend; allowed: image/png, image/jpeg, image/gif, image/webp`},
		{"bmp image in a tool result", user(`{"type":"tool_result","tool_use_id":"c","content":[{"type":"image","source":{"type":"base64","media_type":"image/bmp","data":"Qk0="}}]}`),
			"messages[0].content[0].content[0].source.media_type", "allowed: image/png"},
		{"image without data", user(`{"type":"image","source":{"type":"base64","media_type":"image/png"}}`), "messages[0].content[0].source.data", "field required"},
		{"image with empty data", user(`{"type":"image","source":{"type":"base64","media_type":"image/png","data":""}}`), "messages[0].content[0].source.data", "must not be empty"},
		{"image with bad base64", user(`{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA A"}}`), "messages[0].content[0].source.data", "not valid base64"},
		{"image without media type", user(`{"type":"image","source":{"type":"base64","data":"AAAA"}}`), "messages[0].content[0].source.media_type", "field required"},
		{"image file source", user(`{"type":"image","source":{"type":"file","file_id":"f"}}`), "messages[0].content[0].source.type", `"file" cannot be sent to the OpenAI backend; allowed: base64, url`},
		{"image without source", user(`{"type":"image"}`), "messages[0].content[0].source", "field required"},
		{"image url not http", user(`{"type":"image","source":{"type":"url","url":"file:///etc/passwd"}}`), "messages[0].content[0].source.url", "http:// or https://"},
		{"document without source", user(`{"type":"document"}`), "messages[0].content[0].source", "field required"},
		{"document file source", user(`{"type":"document","source":{"type":"file","file_id":"f"}}`), "messages[0].content[0].source.type",
			`document source type "file" cannot be sent to the OpenAI backend; allowed: base64 (PDF), url (PDF), text, content`},
		{"base64 document not a PDF", user(`{"type":"document","source":{"type":"base64","media_type":"text/plain","data":"aGk="}}`), "messages[0].content[0].source.media_type", "allowed: application/pdf"},
		{"PDF without data", user(`{"type":"document","source":{"type":"base64","media_type":"application/pdf"}}`), "messages[0].content[0].source.data", "field required"},
		{"PDF with empty data", user(`{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":""}}`), "messages[0].content[0].source.data", "must not be empty"},
		{"empty text document", user(`{"type":"document","source":{"type":"text","media_type":"text/plain","data":""}}`), "messages[0].content[0].source.data", "must not be empty"},
		{"text document of another type", user(`{"type":"document","source":{"type":"text","media_type":"text/html","data":"<p>"}}`), "messages[0].content[0].source.media_type", "allowed: text/plain"},
		{"empty content document", user(`{"type":"document","source":{"type":"content","content":[]}}`), "messages[0].content[0].source.content", "at least one block"},
		{"content document with a PDF inside", user(`{"type":"document","source":{"type":"content","content":[{"type":"document","source":` + pdf + `}]}}`),
			"messages[0].content[0].source.content[0].type", "in a document's content source; allowed there: text, image"},
		{"document title not a string", user(`{"type":"document","title":5,"source":` + pdf + `}`), "messages[0].content[0].title", "must be a string"},
		{"search result without text content", user(`{"type":"search_result","source":"s","title":"t","content":[{"type":"image"}]}`), "messages[0].content[0].content[0].type", "allowed: text"},
		{"image base64 with bits after the end", user(`{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AB=="}}`), "messages[0].content[0].source.data", "not valid base64"},
		{"image base64 with bits after the end (one pad)", user(`{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAB="}}`), "messages[0].content[0].source.data", "not valid base64"},
		{"PDF with bad base64", user(`{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBE*i0x"}}`), "messages[0].content[0].source.data", "not valid base64"},
		{"invalid UTF-8 in a text", head + "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"caf\xe9\"}]}]}", "messages[0].content[0].text", "is not valid UTF-8 (byte 0xe9 at offset 109 of the body"},
		{"invalid UTF-8 in a tool input", head + "[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"n\",\"input\":{\"p\":[\"\xff\"]}}]}]}",
			"messages[1].content[0].input.p[0]", "is not valid UTF-8"},
		{"invalid UTF-8 in a key", `{"model":"m","max_tokens":1,"metadata":{"x` + "\xc0\xaf" + `":1},"messages":[{"role":"user","content":"a"}]}`, "metadata.x\ufffd\ufffd (object key)", "is not valid UTF-8"},
		{"orphan tool_result", head + `[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"n","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1"},{"type":"tool_result","tool_use_id":"toolu_2"}]}]}`,
			"messages[2].content[1].tool_use_id", `"toolu_2" matches no tool_use block of the assistant message before it (messages[1])`},
		{"tool_result answering an older assistant message", head + `[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"n","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1"}]},{"role":"assistant","content":"ok"},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1"}]}]}`,
			"messages[4].content[0].tool_use_id", "(messages[3])"},
		{"search result without title", user(`{"type":"search_result","source":"s","content":[]}`), "messages[0].content[0].title", "field required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeRequest([]byte(tt.body))
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("DecodeRequest = %v, want a *RequestError", err)
			}
			if re.Field != tt.field || !strings.Contains(re.Message, tt.msg) {
				t.Errorf("error %q at %q, want %q at %q", re.Message, re.Field, tt.msg, tt.field)
			}
			// count_tokens refuses the same request.
			if _, err := DecodeCountTokens([]byte(tt.body)); !errors.As(err, &re) || re.Field != tt.field {
				t.Errorf("DecodeCountTokens = %v, want the same refusal at %q", err, tt.field)
			}
		})
	}
}

func TestDecodeAcceptsEdgeCases(t *testing.T) {
	for name, body := range map[string]string{
		"final assistant message may be empty":                `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":[]}]}`,
		"a history that starts with tool results (compacted)": `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_gone","content":"x"}]},{"role":"user","content":"go on"}]}`,
		"tool_result after a system message":                  `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1__ts__9","name":"n","input":{}}]},{"role":"system","content":"note"},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1"}]}]}`,
		"escaped non-UTF-8 is fine":                           `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"caf\u00e9 \ud83d\ude00 é"}]}`,
		"base64 of every padding":                             `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"QQ=="}},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"QUI="}},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"QUJD"}}]}]}`,
		"empty strings are left to the backend":               `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":""}]}`,
		"padded base64":                                       `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/gif","data":"R0lGOA=="}}]}]}`,
	} {
		if _, err := DecodeRequest([]byte(body)); err != nil {
			t.Errorf("%s: DecodeRequest = %v, want accepted", name, err)
		}
	}
	// count_tokens needs no max_tokens.
	r, err := DecodeCountTokens([]byte(`{"model":"m","messages":[{"role":"user","content":"foo"}],"tools":[]}`))
	if err != nil {
		t.Fatalf("DecodeCountTokens without max_tokens = %v", err)
	}
	// {"messages":[{"content":"foo","role":"user"}],"tools":[]} is 57 bytes → 15.
	if got := r.EstimatedTokens(); got != 15 {
		t.Errorf("EstimatedTokens = %d, want 15", got)
	}
	if _, err := DecodeRequest([]byte(`{"model":"m","messages":[{"role":"user","content":"foo"}]}`)); err == nil {
		t.Error("DecodeRequest without max_tokens accepted")
	}
}

func TestIsBase64(t *testing.T) {
	for s, want := range map[string]bool{
		"": true, "AAAA": true, "AA==": true, "AAA=": true, "ab+/": true,
		"AAA": false, "A===": false, "=AAA": false, "AA=A": false, "AA\nA": false, "AA-_": false,
	} {
		if got := isBase64(s); got != want {
			t.Errorf("isBase64(%q) = %v, want %v", s, got, want)
		}
	}
}

// TestNothingToSend: a request whose messages all vanish in translation is
// refused rather than sent with an empty input.
func TestNothingToSend(t *testing.T) {
	req, err := DecodeRequest([]byte(`{"model":"gpt-5.5","max_tokens":1,"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"x"},{"type":"redacted_thinking","data":"y"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	_, err = ToResponses(req, Options{})
	var re *RequestError
	if !errors.As(err, &re) || re.Field != "messages" || !strings.Contains(re.Message, "nothing would reach the model") {
		t.Errorf("ToResponses = %v, want a *RequestError for messages", err)
	}
}

func TestDocumentTranslation(t *testing.T) {
	const pdf = "JVBERi0xLjQK"
	tests := []struct {
		name, messages, want string
	}{
		{"base64 PDF at the top level", `[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"` + pdf + `"}},{"type":"text","text":"summarise"}]}]`,
			`[{"role":"user","content":[{"type":"input_file","file_data":"data:application/pdf;base64,` + pdf + `","filename":"document.pdf"},{"type":"input_text","text":"summarise"}]}]`},
		{"titled PDF with context", `[{"role":"user","content":[{"type":"document","title":"Q3/report","context":"from finance","source":{"type":"base64","media_type":"application/pdf","data":"` + pdf + `"}}]}]`,
			`[{"role":"user","content":[{"type":"input_text","text":"Document title: Q3/report\nDocument context: from finance"},{"type":"input_file","file_data":"data:application/pdf;base64,` + pdf + `","filename":"Q3_report.pdf"}]}]`},
		{"PDF URL", `[{"role":"user","content":[{"type":"document","source":{"type":"url","url":"https://example.com/a.pdf"}}]}]`,
			`[{"role":"user","content":[{"type":"input_file","file_url":"https://example.com/a.pdf"}]}]`},
		{"plain text", `[{"role":"user","content":[{"type":"document","source":{"type":"text","media_type":"text/plain","data":"The grass is green."}}]}]`,
			`[{"role":"user","content":[{"type":"input_text","text":"The grass is green."}]}]`},
		{"content source", `[{"role":"user","content":[{"type":"document","source":{"type":"content","content":[{"type":"text","text":"one"},{"type":"image","source":{"type":"url","url":"https://x/p.png"}}]}}]}]`,
			`[{"role":"user","content":[{"type":"input_text","text":"one"},{"type":"input_image","image_url":"https://x/p.png"}]}]`},
		{"content source as a string", `[{"role":"user","content":[{"type":"document","source":{"type":"content","content":"whole text"}}]}]`,
			`[{"role":"user","content":[{"type":"input_text","text":"whole text"}]}]`},
		{"search result", `[{"role":"user","content":[{"type":"search_result","source":"https://s/1","title":"Doc","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}]`,
			`[{"role":"user","content":[{"type":"input_text","text":"Search result: Doc (https://s/1)\na\nb"}]}]`},
		{"PDF read by a tool (Claude Code's Read)", `[{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"PDF file read"},{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"` + pdf + `"}}]}]}]`,
			`[{"type":"function_call_output","call_id":"toolu_1","output":"[{\"type\":\"text\",\"text\":\"PDF file read\"},{\"type\":\"document\",\"note\":\"attached to the next user message as document 1 of tool call toolu_1\"}]"},` +
				`{"role":"user","content":[{"type":"input_text","text":"The following document is document 1 of tool call toolu_1:"},{"type":"input_file","file_data":"data:application/pdf;base64,` + pdf + `","filename":"document.pdf"}]}]`},
		{"documents and images in one tool result, then text", `[{"role":"user","content":[{"type":"tool_result","tool_use_id":"c","content":[{"type":"document","source":{"type":"text","media_type":"text/plain","data":"notes"}},{"type":"image","source":{"type":"url","url":"https://x/1.png"}},{"type":"document","source":{"type":"url","url":"https://x/2.pdf"}}]},{"type":"text","text":"go"}]}]`,
			`[{"type":"function_call_output","call_id":"c","output":"[{\"type\":\"document\",\"note\":\"attached to the next user message as document 1 of tool call c\"},{\"type\":\"image\",\"note\":\"attached to the next user message as image 1 of tool call c\"},{\"type\":\"document\",\"note\":\"attached to the next user message as document 2 of tool call c\"}]"},` +
				`{"role":"user","content":[{"type":"input_text","text":"The following document is document 1 of tool call c:"},{"type":"input_text","text":"notes"},{"type":"input_text","text":"The following image is image 1 of tool call c:"},{"type":"input_image","image_url":"https://x/1.png"},{"type":"input_text","text":"The following document is document 2 of tool call c:"},{"type":"input_file","file_url":"https://x/2.pdf"},{"type":"input_text","text":"go"}]}]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := inputOf(t, "gpt-5.5", tt.messages, "")
			want := mustJSON(t, tt.want)
			if mustMarshal(got) != mustMarshal(want) {
				t.Errorf("input\n got %s\nwant %s", mustMarshal(got), mustMarshal(want))
			}
		})
	}
}

// TestDocumentItemsAreCanonical: the items carrying documents are in the
// canonical form (sorted keys, compact), so continuation matching sees the
// same bytes the next turn rebuilds.
func TestDocumentItemsAreCanonical(t *testing.T) {
	turn := translate(t, `{"model":"gpt-5.5","max_tokens":1,"messages":[{"role":"user","content":[{"type":"document","title":"t","source":{"type":"base64","media_type":"application/pdf","data":"JVBERi0xLjQK"}},{"type":"document","source":{"type":"url","url":"https://x/a.pdf"}}]}]}`, Options{})
	for i, it := range turn.Input {
		c, err := CanonicalItem(it)
		if err != nil {
			t.Fatal(err)
		}
		if string(c) != string(it) {
			t.Errorf("item %d\n got %s\ncanonical %s", i, it, c)
		}
	}
}

func TestDocumentFilename(t *testing.T) {
	for in, want := range map[string]string{
		"": "document.pdf", "  ": "document.pdf", "report": "report.pdf", "Report.PDF": "Report.PDF",
		"a/b\\c": "a_b_c.pdf", "x\ny": "x_y.pdf", strings.Repeat("é", 60): strings.Repeat("é", 50) + ".pdf",
	} {
		if got := documentFilename(in); got != want {
			t.Errorf("documentFilename(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestCountTokensCountsDocuments: count_tokens counts a document by what
// is forwarded for it (its bytes, as every non-image block), so a request
// with a PDF costs more than the same request without it by the PDF's
// share of the body.
func TestCountTokensCountsDocuments(t *testing.T) {
	data := strings.Repeat("QUJD", 1000) // 4000 base64 bytes
	without := `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`
	with := `{"model":"m","messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"` + data + `"}},{"type":"text","text":"x"}]}]}`
	a, err := DecodeCountTokens([]byte(without))
	if err != nil {
		t.Fatal(err)
	}
	b, err := DecodeCountTokens([]byte(with))
	if err != nil {
		t.Fatal(err)
	}
	// Without: {"messages":[{"content":[{"text":"x","type":"text"}],"role":"user"}]} is 69 bytes → 18.
	// The document block {"source":{"data":"…","media_type":"application/pdf","type":"base64"},"type":"document"}
	// and its comma add 4000 + 88 bytes: 4157 → 1040.
	if a.EstimatedTokens() != 18 || b.EstimatedTokens() != 1040 {
		t.Errorf("estimates %d and %d, want 18 and 1040", a.EstimatedTokens(), b.EstimatedTokens())
	}
}
