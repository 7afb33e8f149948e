package translate

import (
	"slices"
	"strings"
)

// Structured outputs (docs/translation.md §1.3): output_config.format, or
// the older beta's top-level output_format, of type json_schema becomes the
// Responses text.format with strict: true. The schema is rewritten into what
// the backend's strict mode takes when that keeps every answer valid for
// the client's schema; anything else is refused naming the keyword.

// formatName is the name text.format carries (the Messages API has none).
const formatName = "structured_output"

// decodeOutputConfig reads output_config (effort, format) and the beta's
// output_format.
func (r *MessagesRequest) decodeOutputConfig(d *jsonDoc, w *wireRequest) error {
	formatNode := -1
	formatField := ""
	if oc := w[wOutputConfig]; !d.null(oc) {
		if d.kind(oc) != '{' {
			return reqErr("output_config", "must be an object")
		}
		if eff := d.getFold(oc, "effort"); !d.null(eff) {
			e, err := d.decodeString(eff, "output_config.effort")
			if err != nil {
				return err
			}
			r.effort = trimSpace(e)
		}
		if f := d.getFold(oc, "format"); !d.null(f) {
			formatNode, formatField = f, "output_config.format"
		}
	}
	if f := w[wOutputFormat]; !d.null(f) {
		if formatNode >= 0 {
			return reqErr("output_format", "send the schema once: output_config.format or output_format (the older beta), not both")
		}
		formatNode, formatField = f, "output_format"
	}
	if formatNode < 0 {
		return nil
	}
	var err error
	r.format, err = d.decodeFormat(formatNode, formatField)
	return err
}

// decodeFormat checks a json_schema format and renders the text.format
// object: {"type":"json_schema","name":…,"schema":…,"strict":true}.
func (d *jsonDoc) decodeFormat(i int, field string) ([]byte, error) {
	if err := d.decodeObject(i, field); err != nil {
		return nil, err
	}
	typ := d.getFold(i, "type")
	if d.null(typ) {
		return nil, reqErr(field+".type", "field required; allowed: json_schema")
	}
	t, err := d.decodeString(typ, field+".type")
	if err != nil {
		return nil, err
	}
	if t != "json_schema" {
		return nil, reqErr(field+".type", "format type %q cannot be sent to the OpenAI backend; allowed: json_schema", bounded(t))
	}
	schema := d.getFold(i, "schema")
	if d.null(schema) {
		return nil, reqErr(field+".schema", "field required for a json_schema format")
	}
	path := field + ".schema"
	if err := d.decodeObject(schema, path); err != nil {
		return nil, err
	}
	if !d.schemaHasType(schema, "object") {
		return nil, reqErr(path+".type", `the root of a schema must be "type": "object": the OpenAI backend's strict structured outputs take no other root`)
	}
	if d.get(schema, "anyOf") >= 0 {
		return nil, reqErr(path+".anyOf", "the root of a schema cannot be anyOf in the OpenAI backend's strict structured outputs; wrap the alternatives in a property")
	}
	b := append(make([]byte, 0, len(d.raw(schema))+96), `{"type":"json_schema","name":"`+formatName+`","schema":`...)
	if b, err = d.strictSchema(b, schema, path); err != nil {
		return nil, err
	}
	return append(b, `,"strict":true}`...), nil
}

// Schema keywords, by what strict structured outputs do with them.
var (
	// annotations change no answer's validity: left out, as the backend's
	// strict mode refuses some of them.
	schemaAnnotations = []string{"$schema", "$comment", "default", "examples", "readOnly", "writeOnly", "deprecated"}
	// schemaKeywords are sent as they are (the sub-schemas rewritten).
	schemaKeywords = []string{"type", "properties", "required", "additionalProperties", "items", "anyOf", "enum", "const",
		"$ref", "$defs", "definitions", "title", "description", "format", "pattern",
		"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minItems", "maxItems"}
	// schemaFormats are the string formats strict mode checks.
	schemaFormats = []string{"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)

// schemaHasType reports whether schema i's type is typ or a list holding it.
func (d *jsonDoc) schemaHasType(i int, typ string) bool {
	t := d.get(i, "type")
	switch d.kind(t) {
	case '"':
		return d.str(t) == typ
	case '[':
		for c := d.nodes[t].first; c >= 0; c = d.nodes[c].next {
			if d.kind(c) == '"' && d.str(c) == typ {
				return true
			}
		}
	}
	return false
}

// strictSchema appends schema i (at path) as strict mode takes it: every
// object closed (additionalProperties: false) with all its properties
// required, annotations left out, sub-schemas rewritten the same way. Both
// rewrites keep every answer valid for the client's schema: a closed object
// with every property present is one the client's schema accepts. A
// keyword strict mode does not take, or an object the rewrite cannot close
// without changing what is valid, is a *RequestError naming it.
func (d *jsonDoc) strictSchema(b []byte, i int, path string) ([]byte, error) {
	if d.kind(i) != '{' {
		return nil, reqErr(path, "must be a schema object, got %s (the OpenAI backend's strict structured outputs take no boolean schemas)", kindNameOf(d.kind(i)))
	}
	var props []string
	hasProps := false
	required := -1
	b = append(b, '{')
	first := true
	member := func(k string) {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendString(b, k)
		b = append(b, ':')
	}
	var err error
	for c := d.nodes[i].first; c >= 0; c = d.nodes[c].next {
		k := string(d.key(c))
		at := path + "." + k
		switch {
		case slices.Contains(schemaAnnotations, k):
			continue
		case !slices.Contains(schemaKeywords, k):
			return nil, reqErr(at, "keyword %q is not supported by the OpenAI backend's strict structured outputs; supported: %s",
				bounded(k), strings.Join(schemaKeywords, ", "))
		}
		switch k {
		case "required":
			required = c
			continue
		case "additionalProperties":
			if d.kind(c) != 'f' {
				return nil, reqErr(at, "must be false: the OpenAI backend's strict structured outputs take only closed objects")
			}
			continue
		case "format":
			if d.kind(c) != '"' || !slices.Contains(schemaFormats, d.str(c)) {
				return nil, reqErr(at, "format %s is not supported by the OpenAI backend's strict structured outputs; supported: %s",
					bounded(string(d.raw(c))), strings.Join(schemaFormats, ", "))
			}
		}
		member(k)
		switch k {
		case "properties", "$defs", "definitions":
			if err := d.decodeObject(c, at); err != nil {
				return nil, err
			}
			hasProps = hasProps || k == "properties"
			b = append(b, '{')
			for p := d.nodes[c].first; p >= 0; p = d.nodes[p].next {
				name := string(d.key(p))
				if p != d.nodes[c].first {
					b = append(b, ',')
				}
				b = appendString(b, name)
				b = append(b, ':')
				if b, err = d.strictSchema(b, p, at+"."+name); err != nil {
					return nil, err
				}
				if k == "properties" && !slices.Contains(props, name) {
					props = append(props, name)
				}
			}
			b = append(b, '}')
		case "items":
			if d.kind(c) == '[' {
				return nil, reqErr(at, "must be one schema: the OpenAI backend's strict structured outputs take no tuples")
			}
			if b, err = d.strictSchema(b, c, at); err != nil {
				return nil, err
			}
		case "anyOf":
			if err := d.decodeArray(c, at); err != nil {
				return nil, err
			}
			b = append(b, '[')
			n := 0
			for a := d.nodes[c].first; a >= 0; a = d.nodes[a].next {
				if n > 0 {
					b = append(b, ',')
				}
				if b, err = d.strictSchema(b, a, at+"["+itoa(n)+"]"); err != nil {
					return nil, err
				}
				n++
			}
			b = append(b, ']')
		default:
			b = append(b, d.compact(c)...)
		}
	}
	if required >= 0 {
		if err := d.checkRequired(required, props, path+".required"); err != nil {
			return nil, err
		}
	}
	if hasProps || d.schemaHasType(i, "object") {
		if hasProps {
			// Every property required: strict mode has no optional ones.
			member("required")
			b = append(b, '[')
			for n, p := range props {
				if n > 0 {
					b = append(b, ',')
				}
				b = appendString(b, p)
			}
			b = append(b, ']')
		}
		member("additionalProperties")
		b = append(b, "false"...)
	}
	return append(b, '}'), nil
}

// checkRequired checks that required (node i) lists only properties the
// schema defines: requiring an undefined one cannot be kept in strict mode.
func (d *jsonDoc) checkRequired(i int, props []string, path string) error {
	if err := d.decodeArray(i, path); err != nil {
		return err
	}
	n := 0
	for c := d.nodes[i].first; c >= 0; c = d.nodes[c].next {
		if d.kind(c) != '"' {
			return reqErr(path+"["+itoa(n)+"]", "must be a string, got %s", kindNameOf(d.kind(c)))
		}
		if name := d.str(c); !slices.Contains(props, name) {
			return reqErr(path+"["+itoa(n)+"]", "%q is required but not in properties; the OpenAI backend's strict structured outputs require exactly the properties defined", bounded(name))
		}
		n++
	}
	return nil
}

func itoa(n int) string { return string(appendInt(nil, n)) }
