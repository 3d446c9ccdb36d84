// One render, as Deckhouse's engine.go renders a template (parse under the step's name, execute
// with a deep copy of the data plus `Files`, `tpl` re-entering with the root data), with the
// guards of guard.go, and its result as the host reads it: the output, or the error with its
// line.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"text/template"
)

// Request is what the host sends: the template's name (the step name, as in Deckhouse's
// errors), its text and the context (decoded from JSON, so numbers are float64 as Deckhouse's).
type Request struct {
	Name     string                 `json:"name"`
	Template string                 `json:"template"`
	Data     map[string]interface{} `json:"data"`
	// DataKey names Data; a request with the key of the previous one and no Data reuses it
	// (the scripts of one node group share one context, decoded once).
	DataKey string `json:"dataKey"`
	// Bytes the rendered script may have; 0 means no limit.
	MaxOutput int `json:"maxOutput"`
}

// Result is the output, or the refusal: the line (0 when unknown), the construct it is about
// (the action as Go prints it) and the reason.
type Result struct {
	Out    *string `json:"out,omitempty"`
	Err    string  `json:"err,omitempty"`
	Line   int     `json:"line,omitempty"`
	At     string  `json:"at,omitempty"`
	Reason string  `json:"reason,omitempty"`
}

// A render in progress: tpl re-enters render with a clone of the current template set and the
// root data, as engine.go does, so renders nest; the wasm module runs one call at a time.
type engine struct {
	name      string
	data      map[string]interface{}
	maxOutput int
}

type frame struct {
	e engine
	t *template.Template
}

var stack []frame

// The function set is the same for every render; only tpl needs the render it runs in, and
// finds it on the stack. Cloning a template with the functions bound is much cheaper than
// binding ~200 functions to every new template.
var base = template.New("").Funcs(engineFuncs())

func engineFuncs() template.FuncMap {
	f := deckhouseFuncs()
	f["include"] = func(name string, data interface{}) (string, error) {
		return "", refusal("include is a stub in Deckhouse: it writes \"NotImplemented\" into the script instead of template %q; use {{ template %q . }}", name, name)
	}
	f["tpl"] = func(text string, vals map[string]interface{}) (string, error) {
		top := stack[len(stack)-1]
		clone, err := top.t.Clone()
		if err != nil {
			return "", fmt.Errorf("clone template failed: %v", err)
		}
		out, err := top.e.render(text, clone)
		if err != nil {
			return "", fmt.Errorf("error during tpl function execution for %q: %w", text, err)
		}
		return out, nil
	}
	f["required"] = required
	guardFuncs(f)
	return f
}

// The last context decoded, with the reasons of its kept-out values.
var last struct {
	key  string
	data map[string]interface{}
	why  []string
}

// Render renders one request; it never panics.
func Render(req Request) Result {
	if req.Data != nil || req.DataKey == "" || req.DataKey != last.key {
		data := req.Data
		if data == nil {
			data = map[string]interface{}{}
		}
		resetKeptOut()
		last.key, last.data = req.DataKey, markKeptOut(data).(map[string]interface{})
		last.why = append([]string(nil), keptOutWhy...)
	}
	keptOutWhy = append(keptOutWhy[:0], last.why...)
	e := engine{name: req.Name, data: last.data, maxOutput: req.MaxOutput}
	var t *template.Template
	if namesTemplates(req.Template) {
		clone, err := base.Clone()
		if err != nil {
			return describe(req.Name, err)
		}
		t = clone
	} else {
		// Nothing in the script refers to a template by name, so the (costly) fresh set of
		// templates Deckhouse makes for each render would make no difference: reuse one.
		t, e.name = base, sharedName
	}
	out, err := e.render(req.Template, t)
	if err == nil {
		err = keptOutInOutput(out)
	}
	if err != nil {
		return describe(req.Name, err)
	}
	return Result{Out: &out}
}

const sharedName = "__bb_script"

// namesTemplates: the text could define or call a named template, or run tpl (which sees them).
func namesTemplates(text string) bool {
	for _, w := range []string{"template", "define", "block", "tpl"} {
		if strings.Contains(text, w) {
			return true
		}
	}
	return false
}

func (e engine) render(text string, t *template.Template) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("rendering template failed: %v", r)
		}
	}()
	stack = append(stack, frame{e, t})
	defer func() { stack = stack[:len(stack)-1] }()
	if _, err := t.New(e.name).Parse(text); err != nil {
		return "", err
	}
	guardPrints(t)
	data := deepCopy(e.data).(map[string]interface{})
	data["Files"] = files{}
	w := &limitedWriter{max: e.maxOutput}
	if err := t.ExecuteTemplate(w, e.name, data); err != nil {
		return "", err
	}
	return w.buf.String(), nil
}

// deepCopy copies the decoded JSON context (Deckhouse copies its data for every render, so a
// template's `set` never reaches the next render or a `tpl`).
func deepCopy(v interface{}) interface{} {
	switch x := v.(type) {
	case map[string]interface{}:
		m := make(map[string]interface{}, len(x))
		for k, e := range x {
			m[k] = deepCopy(e)
		}
		return m
	case []interface{}:
		l := make([]interface{}, len(x))
		for i, e := range x {
			l[i] = deepCopy(e)
		}
		return l
	}
	return v
}

// files stands for Deckhouse's `Files` (Helm's .Files.Get, reading the bashible-apiserver's own
// files): this server has none of Deckhouse's files, so reading one is refused.
type files struct{}

func (files) Get(path string) (string, error) {
	return "", refusal(".Files.Get %q reads a file of Deckhouse's bashible-apiserver image; this server ships none of them: put the content into the script", path)
}

type limitedWriter struct {
	buf bytes.Buffer
	max int
}

var errTooLong = errors.New("too long")

func (w *limitedWriter) Write(p []byte) (int, error) {
	if w.max > 0 && w.buf.Len()+len(p) > w.max {
		return 0, errTooLong
	}
	return w.buf.Write(p)
}

// "template: NAME:LINE:COL: executing \"NAME\" at <NODE>: MSG" and "template: NAME:LINE: MSG".
var (
	execErr  = regexp.MustCompile(`(?s)^template: [^:]*:(\d+):\d+: executing "[^"]*" at <(.*?)>: (.*)$`)
	parseErr = regexp.MustCompile(`(?s)^template: [^:]*:(\d+):(?:\d+:)? ?(.*)$`)
	calling  = regexp.MustCompile(`^error calling (\S+): `)
)

// describe turns an error into the line, the construct and a reason that names the function.
func describe(name string, err error) Result {
	msg := err.Error()
	res := Result{Err: msg, Reason: msg}
	if errors.Is(err, errTooLong) {
		res.Reason = "the rendered script is longer than the limit for one step"
	}
	var m []string
	if m = execErr.FindStringSubmatch(msg); m != nil {
		res.Line, _ = strconv.Atoi(m[1])
		res.At, res.Reason = m[2], m[3]
	} else if m = parseErr.FindStringSubmatch(msg); m != nil {
		res.Line, _ = strconv.Atoi(m[1])
		res.Reason = m[2]
	}
	// A guard's own message needs no "error calling __bb…" prefix, nor one that names its function.
	if c := calling.FindStringSubmatch(res.Reason); c != nil {
		rest := res.Reason[len(c[0]):]
		head := rest
		if len(head) > 32 {
			head = head[:32]
		}
		if strings.HasPrefix(c[1], guardPrefix) || strings.Contains(head, c[1]) {
			res.Reason = rest
		} else {
			res.Reason = c[1] + ": " + rest
		}
	}
	// Go's type errors name the stand-in's type: say what it stands for.
	if strings.Contains(res.Reason, "main.keptOut") {
		res.Reason = strings.ReplaceAll(res.Reason, "main.keptOut", "a value kept out of the context")
		for _, why := range keptOutWhy {
			if path, _, ok := strings.Cut(why, " "); ok && strings.Contains(res.At, path) {
				res.Reason += " (" + why + ")"
				break
			}
		}
	}
	if i := strings.Index(res.Reason, requiredStart); i >= 0 {
		if j := strings.Index(res.Reason, requiredEnd); j > i {
			res.Reason = res.Reason[i+len(requiredStart) : j]
		}
	}
	if strings.HasPrefix(res.At, guardPrefix) {
		res.At = ""
	}
	return res
}

func decodeRequest(b []byte) (Request, error) {
	var req Request
	err := json.Unmarshal(b, &req)
	return req, err
}
