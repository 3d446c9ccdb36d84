// The guards: where Deckhouse's output would itself be a bug, the render fails instead, naming
// the line; everywhere else the output is Deckhouse's, byte for byte.
//
//   - printing a value that is missing or nil (Go writes "<no value>"), and print/printf of one
//     (Go writes "<nil>");
//   - printf whose verbs do not fit its arguments (Go writes "%!d(float64=110)");
//   - a value the context keeps out (secrets, and what this server cannot know) printed or
//     passed to any function;
//   - include (a stub writing "NotImplemented"), toToml of what TOML cannot hold (the error text
//     lands in the script), functions whose result changes on every render (the clock, random
//     values, DNS), which would change the node's checksum on every render;
//   - keys/values come out sorted: Deckhouse's order is random, sorted is one of its orders.
package main

import (
	"encoding/base32"
	"encoding/base64"
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"
	"text/template/parse"
)

// guardPrefix names the functions the guards add; errors from them need no function name.
const guardPrefix = "__bb"

const printGuard = guardPrefix + "Print"

type refusedError struct{ msg string }

func (e refusedError) Error() string { return e.msg }

func refusal(format string, args ...interface{}) error {
	return refusedError{fmt.Sprintf(format, args...)}
}

// keptOut stands in the context for a value this server keeps out (a secret, or something it
// cannot know): a JSON object {"$keptOut": "why"} from the host, `why` starting with the value's
// path. It is true in `if` and `with`, as Deckhouse's non-empty value is. Passed to a function,
// printed, or turned into text any way (toYaml, print of a map holding it, …), it fails the
// render with `why`: its text forms are a marker that is looked for in every function's string
// result and in the output. Neither the marker nor `why` holds the value.
type keptOut struct{ id int }

const keptOutKey = "$keptOut"

var keptOutWhy []string

func resetKeptOut() { keptOutWhy = keptOutWhy[:0] }

func (k keptOut) marker() string               { return fmt.Sprintf("__bb_kept_out_%d__", k.id) }
func (k keptOut) String() string               { return k.marker() }
func (k keptOut) GoString() string             { return k.marker() }
func (k keptOut) MarshalText() ([]byte, error) { return []byte(k.marker()), nil }
func (k keptOut) MarshalJSON() ([]byte, error) { return []byte(strconv.Quote(k.marker())), nil }
func (k keptOut) why() string                  { return keptOutWhy[k.id] }

var markerRe = regexp.MustCompile(`__bb_kept_out_(\d+)__`)

// markKeptOut replaces every {"$keptOut": why} below v with a keptOut.
func markKeptOut(v interface{}) interface{} {
	switch x := v.(type) {
	case map[string]interface{}:
		if why, ok := x[keptOutKey].(string); ok && len(x) == 1 {
			keptOutWhy = append(keptOutWhy, why)
			return keptOut{len(keptOutWhy) - 1}
		}
		for k, e := range x {
			x[k] = markKeptOut(e)
		}
	case []interface{}:
		for i, e := range x {
			x[i] = markKeptOut(e)
		}
	}
	return v
}

// keptOutArg is the reason when an argument itself is a kept-out value.
func keptOutArg(v reflect.Value) string {
	for v.IsValid() && v.Kind() == reflect.Interface && !v.IsNil() {
		v = v.Elem()
	}
	if v.IsValid() && v.Type() == reflect.TypeOf(keptOut{}) {
		return v.Interface().(keptOut).why()
	}
	return ""
}

// keptOutText is the error for text that holds a kept-out value's marker, or nil.
func keptOutText(s string) error {
	if m := markerRe.FindStringSubmatch(s); m != nil {
		if id, err := strconv.Atoi(m[1]); err == nil && id < len(keptOutWhy) {
			return refusedError{keptOutWhy[id]}
		}
	}
	return nil
}

func keptOutInOutput(out string) error { return keptOutText(out) }

// Functions whose result differs from one render to the next.
var unrepeatable = map[string]string{
	"now":                      "reads the clock",
	"ago":                      "reads the clock",
	"randAlphaNum":             "is random",
	"randAlpha":                "is random",
	"randAscii":                "is random",
	"randNumeric":              "is random",
	"randInt":                  "is random",
	"randBytes":                "is random",
	"shuffle":                  "is random",
	"uuidv4":                   "is random",
	"bcrypt":                   "salts at random",
	"htpasswd":                 "salts at random",
	"encryptAES":               "uses a random IV",
	"genPrivateKey":            "makes a new key",
	"genCA":                    "makes a new key",
	"genCAWithKey":             "makes a new certificate",
	"genSelfSignedCert":        "makes a new key",
	"genSelfSignedCertWithKey": "makes a new certificate",
	"genSignedCert":            "makes a new key",
	"genSignedCertWithKey":     "makes a new certificate",
	"getHostByName":            "asks DNS from the bundle server",
}

// guardFuncs wraps every function: a kept-out value among the arguments is refused; the
// functions above are refused; printf/print/println, toToml, keys and values are replaced.
func guardFuncs(f template.FuncMap) {
	for name, fn := range f {
		if why, ok := unrepeatable[name]; ok {
			f[name] = refusing(fn, name, why)
			continue
		}
		f[name] = scanning(fn)
	}
	f["printf"] = scanning(checkedPrintf)
	f["print"] = scanning(func(args ...interface{}) (string, error) { return checkedPrint("print", fmt.Sprint, args) })
	f["println"] = scanning(func(args ...interface{}) (string, error) {
		return checkedPrint("println", fmt.Sprintln, args)
	})
	f["toToml"] = scanning(checkedTOML)
	f["b64dec"] = scanning(func(s string) (string, error) {
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return "", refusal("b64dec: %v: Deckhouse writes this error into the script", err)
		}
		return string(b), nil
	})
	f["b32dec"] = scanning(func(s string) (string, error) {
		b, err := base32.StdEncoding.DecodeString(s)
		if err != nil {
			return "", refusal("b32dec: %v: Deckhouse writes this error into the script", err)
		}
		return string(b), nil
	})
	derive := f["derivePassword"]
	f["derivePassword"] = func(counter uint32, kind, password, user, site string) (string, error) {
		out := derive.(func(uint32, string, string, string, string) string)(counter, kind, password, user, site)
		if strings.HasPrefix(out, "failed to derive password") {
			return "", refusal("derivePassword: %s: Deckhouse writes this error into the script", out)
		}
		return out, nil
	}
	keys := f["keys"]
	f["keys"] = func(dicts ...map[string]interface{}) ([]string, error) {
		out := reflect.ValueOf(keys).Call(mapArgs(dicts))[0].Interface().([]string)
		sort.Strings(out)
		return out, nil
	}
	f["values"] = scanning(func(dict map[string]interface{}) []interface{} {
		names := make([]string, 0, len(dict))
		for k := range dict {
			names = append(names, k)
		}
		sort.Strings(names)
		out := make([]interface{}, 0, len(dict))
		for _, k := range names {
			out = append(out, dict[k])
		}
		return out
	})
	f[printGuard] = printed
}

func mapArgs(dicts []map[string]interface{}) []reflect.Value {
	out := make([]reflect.Value, len(dicts))
	for i, d := range dicts {
		out[i] = reflect.ValueOf(d)
	}
	return out
}

// scanning is fn refusing kept-out values: as an argument, or as text in its string result.
// Same type as fn, so Go checks and converts the arguments exactly as for fn.
func scanning(fn interface{}) interface{} {
	v := reflect.ValueOf(fn)
	t := v.Type()
	return reflect.MakeFunc(t, func(args []reflect.Value) []reflect.Value {
		for i, a := range args {
			if t.IsVariadic() && i == len(args)-1 {
				for j := 0; j < a.Len(); j++ {
					if why := keptOutArg(a.Index(j)); why != "" {
						panic(refusedError{why})
					}
				}
			} else if why := keptOutArg(a); why != "" {
				panic(refusedError{why})
			}
		}
		var out []reflect.Value
		if t.IsVariadic() {
			out = v.CallSlice(args)
		} else {
			out = v.Call(args)
		}
		if len(out) > 0 && out[0].Kind() == reflect.String {
			if err := keptOutText(out[0].String()); err != nil {
				panic(err)
			}
		}
		return out
	}).Interface()
}

func refusing(fn interface{}, name, why string) interface{} {
	t := reflect.TypeOf(fn)
	return reflect.MakeFunc(t, func([]reflect.Value) []reflect.Value {
		panic(refusal("%s %s, so Deckhouse renders a different script each time and the node's checksum changes on every render: put the value into the script", name, why))
	}).Interface()
}

// printed guards an action's value: "<no value>" is never written into a script, nor a kept-out
// value (one inside a map or list shows as its marker, which the output check finds).
func printed(src string, v interface{}) (interface{}, error) {
	if v == nil {
		return nil, refusal("%s has no value: Deckhouse would write \"<no value>\" into the script", src)
	}
	if why := keptOutArg(reflect.ValueOf(v)); why != "" {
		return nil, refusedError{why}
	}
	if _, isString := v.(string); !isString {
		if err := keptOutText(fmt.Sprint(v)); err != nil {
			return nil, err
		}
	}
	return v, nil
}

func checkedPrint(name string, f func(...interface{}) string, args []interface{}) (string, error) {
	for i, a := range args {
		if a == nil {
			return "", refusal("%s: argument %d has no value: Deckhouse would write \"<nil>\" into the script", name, i+1)
		}
	}
	return f(args...), nil
}

// checkedPrintf is printf, refused where fmt reports a bad verb in its output (%!d(float64=110),
// %!s(MISSING), %!(EXTRA …)): numbers from the context are float64 in Deckhouse, so %d of one
// writes "%!d(float64=110)" into the script.
func checkedPrintf(format string, args ...interface{}) (string, error) {
	for i, a := range args {
		if a == nil {
			return "", refusal("printf %q: argument %d has no value: Deckhouse would write \"<nil>\" into the script", format, i+1)
		}
	}
	out := fmt.Sprintf(format, args...)
	if n := strings.Count(out, "%!"); n > 0 {
		expected := strings.Count(format, "%%!")
		for _, a := range args {
			expected += strings.Count(fmt.Sprint(a), "%!")
		}
		if n > expected {
			bad := out[strings.Index(out, "%!"):]
			if end := strings.IndexAny(bad, ")"); end >= 0 {
				bad = bad[:end+1]
			}
			hint := ""
			if strings.Contains(bad, "float64") {
				hint = " (numbers from the context are float64: use %v, or int)"
			}
			return "", refusal("printf %s: Go writes %s into the script%s", strconv.Quote(format), strconv.Quote(bad), hint)
		}
	}
	return out, nil
}

func checkedTOML(v interface{}) (string, error) {
	out := toTOML(v)
	// toTOML returns the encoder's error text instead of TOML; TOML output never starts so.
	if strings.HasPrefix(out, "toml: ") {
		return "", refusal("toToml: %s: Deckhouse writes this error into the script", out)
	}
	return out, nil
}

// guardPrints makes every printing action end in printGuard: `{{ X }}` runs as
// `{{ X | __bbPrint "X" }}`. Declarations and assignments print nothing and stay as they are.
func guardPrints(t *template.Template) {
	for _, tt := range t.Templates() {
		if tt.Tree != nil && tt.Tree.Root != nil {
			guardList(tt.Tree, tt.Tree.Root)
		}
	}
}

func guardList(tree *parse.Tree, l *parse.ListNode) {
	if l == nil {
		return
	}
	for _, n := range l.Nodes {
		switch x := n.(type) {
		case *parse.ActionNode:
			guardAction(tree, x)
		case *parse.IfNode:
			guardList(tree, x.List)
			guardList(tree, x.ElseList)
		case *parse.RangeNode:
			guardList(tree, x.List)
			guardList(tree, x.ElseList)
		case *parse.WithNode:
			guardList(tree, x.List)
			guardList(tree, x.ElseList)
		case *parse.ListNode:
			guardList(tree, x)
		}
	}
}

func guardAction(tree *parse.Tree, a *parse.ActionNode) {
	p := a.Pipe
	if p == nil || len(p.Decl) > 0 || len(p.Cmds) == 0 {
		return
	}
	last := p.Cmds[len(p.Cmds)-1]
	if id, ok := last.Args[0].(*parse.IdentifierNode); ok && id.Ident == printGuard {
		return // already guarded (a clone made for tpl)
	}
	src := p.String()
	ident := parse.NewIdentifier(printGuard).SetTree(tree).SetPos(a.Pos)
	arg := &parse.StringNode{NodeType: parse.NodeString, Pos: a.Pos, Quoted: strconv.Quote(src), Text: src}
	p.Cmds = append(p.Cmds, &parse.CommandNode{NodeType: parse.NodeCommand, Pos: a.Pos, Args: []parse.Node{ident, arg}})
}
