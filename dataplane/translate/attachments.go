package translate

import (
	"fmt"
	"slices"
	"strings"

	"github.com/clodex/clodex/internal/jsonstr"
)

// imageMediaTypes are the image types the upstream reads.
var imageMediaTypes = []string{"image/png", "image/jpeg", "image/gif", "image/webp"}

func (d *jsonDoc) decodeImageSource(m int, field string, b *block) error {
	s := d.get(m, "source")
	if d.null(s) {
		return reqErr(field+".source", "field required")
	}
	f := field + ".source"
	if err := d.decodeObject(s, f); err != nil {
		return err
	}
	var err error
	if b.sourceType, err = d.reqString(s, "type", f); err != nil {
		return err
	}
	switch b.sourceType {
	case "base64":
		if b.mediaType, err = d.reqString(s, "media_type", f); err != nil {
			return err
		}
		if !slices.Contains(imageMediaTypes, b.mediaType) {
			return reqErr(f+".media_type", "image media type %q cannot be sent to the OpenAI backend; allowed: %s", bounded(b.mediaType), strings.Join(imageMediaTypes, ", "))
		}
		return d.base64Data(s, f, &b.data)
	case "url":
		return d.httpURL(s, f, &b.url)
	}
	return reqErr(f+".type", "image source type %q cannot be sent to the OpenAI backend; allowed: base64, url", bounded(b.sourceType))
}

// base64Data decodes the required, non-empty base64 string "data" of
// source object s.
func (d *jsonDoc) base64Data(s int, f string, dst *string) error {
	data, err := d.reqString(s, "data", f)
	if err != nil {
		return err
	}
	switch {
	case data == "":
		return reqErr(f+".data", "must not be empty")
	case !isBase64(data):
		return reqErr(f+".data", "is not valid base64 (standard alphabet, padded, no spaces or line breaks)")
	}
	*dst = data
	return nil
}

// httpURL decodes the required http(s) URL "url" of source object s.
func (d *jsonDoc) httpURL(s int, f string, dst *string) error {
	u, err := d.reqString(s, "url", f)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(u, "https://") && !strings.HasPrefix(u, "http://") {
		return reqErr(f+".url", "must be an http:// or https:// URL")
	}
	*dst = u
	return nil
}

// isBase64 reports whether s is standard, padded base64 that a strict
// decoder accepts (base64.StdEncoding.Strict: the unused bits before the
// padding are zero): the check is a scan, nothing is decoded.
func isBase64(s string) bool {
	if len(s)%4 != 0 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '+', c == '/':
		case c == '=' && i >= len(s)-2 && (i == len(s)-1 || s[len(s)-1] == '='):
		default:
			return false
		}
	}
	switch {
	case strings.HasSuffix(s, "=="): // one byte: 4 bits of the 2nd digit unused
		return b64Value(s[len(s)-3])&0x0f == 0
	case strings.HasSuffix(s, "="): // two bytes: 2 bits of the 3rd digit unused
		return b64Value(s[len(s)-2])&0x03 == 0
	}
	return true
}

// b64Value is the 6-bit value of a standard base64 digit.
func b64Value(c byte) byte {
	switch {
	case c >= 'A' && c <= 'Z':
		return c - 'A'
	case c >= 'a' && c <= 'z':
		return c - 'a' + 26
	case c >= '0' && c <= '9':
		return c - '0' + 52
	case c == '+':
		return 62
	}
	return 63
}

// decodeDocument decodes a document block: a base64 PDF, a PDF URL, plain
// text, or a content source of text and image blocks, with an optional
// title and context. A file source (the Files API) has no upstream
// equivalent.
func (d *jsonDoc) decodeDocument(m int, field string, b *block) error {
	var err error
	if b.title, _, err = d.optString(m, "title", field); err != nil {
		return err
	}
	if b.context, _, err = d.optString(m, "context", field); err != nil {
		return err
	}
	s := d.get(m, "source")
	if d.null(s) {
		return reqErr(field+".source", "field required")
	}
	f := field + ".source"
	if err := d.decodeObject(s, f); err != nil {
		return err
	}
	if b.sourceType, err = d.reqString(s, "type", f); err != nil {
		return err
	}
	switch b.sourceType {
	case "base64":
		if b.mediaType, err = d.reqString(s, "media_type", f); err != nil {
			return err
		}
		if b.mediaType != "application/pdf" {
			return reqErr(f+".media_type", "document media type %q cannot be sent as base64; allowed: application/pdf (send text as a text source)", bounded(b.mediaType))
		}
		return d.base64Data(s, f, &b.data)
	case "url":
		return d.httpURL(s, f, &b.url)
	case "text":
		if mt, ok, err := d.optString(s, "media_type", f); err != nil {
			return err
		} else if ok && mt != "text/plain" {
			return reqErr(f+".media_type", "text document media type %q is not supported; allowed: text/plain", bounded(mt))
		}
		if b.data, err = d.reqString(s, "data", f); err != nil {
			return err
		}
		if b.data == "" {
			return reqErr(f+".data", "must not be empty")
		}
		return nil
	case "content":
		c := d.get(s, "content")
		if d.null(c) {
			return reqErr(f+".content", "field required")
		}
		if d.kind(c) == '"' {
			if b.contentString = d.str(c); b.contentString == "" {
				return reqErr(f+".content", "must not be empty")
			}
			b.contentIsStr = true
			return nil
		}
		if d.kind(c) != '[' {
			return reqErr(f+".content", "must be a string or an array of text and image blocks, got %s", kindNameOf(d.kind(c)))
		}
		if b.content, err = d.decodeContent(c, f+".content", "document"); err != nil {
			return err
		}
		if len(b.content) == 0 {
			return reqErr(f+".content", "must contain at least one block")
		}
		return nil
	}
	return reqErr(f+".type", "document source type %q cannot be sent to the OpenAI backend; allowed: base64 (PDF), url (PDF), text, content", bounded(b.sourceType))
}

// decodeSearchResult decodes a search_result block: source, title and text
// content, carried upstream as text.
func (d *jsonDoc) decodeSearchResult(m int, field string, b *block) error {
	var err error
	if b.source, err = d.reqString(m, "source", field); err != nil {
		return err
	}
	if b.title, err = d.reqString(m, "title", field); err != nil {
		return err
	}
	c := d.get(m, "content")
	if d.null(c) {
		return reqErr(field+".content", "field required")
	}
	if err := d.decodeArray(c, field+".content"); err != nil {
		return err
	}
	i := 0
	for it := d.nodes[c].first; it >= 0; it, i = d.nodes[it].next, i+1 {
		bf := indexField(field+".content", i)
		if err := d.decodeObject(it, bf); err != nil {
			return err
		}
		typ, err := d.reqString(it, "type", bf)
		if err != nil {
			return err
		}
		if typ != "text" {
			return reqErr(bf+".type", "search result content block type %q is not supported; allowed: text", bounded(typ))
		}
		text, err := d.reqString(it, "text", bf)
		if err != nil {
			return err
		}
		b.content = append(b.content, block{typ: "text", text: text})
	}
	return nil
}

func appendImagePart(parts []byte, b block) []byte {
	var u string
	switch b.sourceType {
	case "base64":
		u = "data:" + b.mediaType + ";base64," + b.data
	case "url":
		u = b.url
	}
	if len(parts) > 1 {
		parts = append(parts, ',')
	}
	parts = append(parts, `{"image_url":`...)
	parts = jsonstr.Append(parts, u)
	return append(parts, `,"type":"input_image"}`...)
}

// defaultDocumentName is the filename of a PDF sent without a title.
const defaultDocumentName = "document.pdf"

// documentFilename is the input_file filename of a base64 PDF: its title
// (path separators and control characters replaced, at most 100 bytes,
// ".pdf" added when missing), else document.pdf.
func documentFilename(title string) string {
	name := strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r == '/' || r == '\\' {
			return '_'
		}
		return r
	}, strings.TrimSpace(title))
	if name == "" {
		return defaultDocumentName
	}
	if len(name) > 100 {
		cut := 100
		for cut > 0 && name[cut]&0xC0 == 0x80 {
			cut--
		}
		name = name[:cut]
	}
	if !strings.HasSuffix(strings.ToLower(name), ".pdf") {
		name += ".pdf"
	}
	return name
}

// appendDocumentParts carries a document block upstream: a line naming its
// title and context when it has them, then an input_file (a base64 PDF as a
// data: URL with a filename, a PDF URL as file_url), or input_text (a text
// source), or the parts of a content source (input_text, input_image).
func appendDocumentParts(parts []byte, b block) []byte {
	var head []string
	if b.title != "" {
		head = append(head, "Document title: "+b.title)
	}
	if b.context != "" {
		head = append(head, "Document context: "+b.context)
	}
	if len(head) > 0 {
		parts = appendTextPart(parts, strings.Join(head, "\n"))
	}
	switch b.sourceType {
	case "base64":
		if len(parts) > 1 {
			parts = append(parts, ',')
		}
		parts = append(parts, `{"file_data":`...)
		parts = jsonstr.Append(parts, "data:"+b.mediaType+";base64,"+b.data)
		parts = append(parts, `,"filename":`...)
		parts = jsonstr.Append(parts, documentFilename(b.title))
		return append(parts, `,"type":"input_file"}`...)
	case "url":
		if len(parts) > 1 {
			parts = append(parts, ',')
		}
		parts = append(parts, `{"file_url":`...)
		parts = jsonstr.Append(parts, b.url)
		return append(parts, `,"type":"input_file"}`...)
	case "text":
		return appendTextPart(parts, b.data)
	case "content":
		if b.contentIsStr {
			return appendTextPart(parts, b.contentString)
		}
		for _, c := range b.content {
			switch c.typ {
			case "text":
				parts = appendTextPart(parts, c.text)
			case "image":
				parts = appendImagePart(parts, c)
			}
		}
	}
	return parts
}

// searchResultText is the text a search_result block is carried as.
func searchResultText(b block) string {
	var t strings.Builder
	t.WriteString("Search result: ")
	t.WriteString(b.title)
	t.WriteString(" (")
	t.WriteString(b.source)
	t.WriteString(")")
	for _, c := range b.content {
		t.WriteString("\n")
		t.WriteString(c.text)
	}
	return t.String()
}

// liftAttachment lifts the n-th image or document c of a tool_result
// (docs/translation.md §4.3): out, the function_call_output being built,
// gets a note where it was; *lifted, the parts of the next user message,
// gets a line naming the tool call, then c.
func liftAttachment(out []byte, lifted *[]byte, c block, n int, callID string) []byte {
	note := fmt.Sprintf("attached to the next user message as %s %d of tool call %s", c.typ, n, callID)
	out = append(out, `{"type":"`...)
	out = append(out, c.typ...)
	out = append(out, `","note":`...)
	out = jsonstr.Append(out, note)
	out = append(out, '}')
	*lifted = appendTextPart(*lifted, fmt.Sprintf("The following %s is %s %d of tool call %s:", c.typ, c.typ, n, callID))
	if c.typ == "image" {
		*lifted = appendImagePart(*lifted, c)
	} else {
		*lifted = appendDocumentParts(*lifted, c)
	}
	return out
}
