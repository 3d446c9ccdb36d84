// Deckhouse's template function set and engine, as its bashible-apiserver renders
// NodeGroupConfiguration content (modules/040-node-manager/images/bashible-apiserver/pkg/template:
// funcs.go, engine.go): sprig v3 without env/expandenv, the Helm-style extras (toYaml, toToml,
// fromYaml, …), `lookup` (always an empty map), the late-bound `include` (a stub), `tpl` (renders
// a string with the root data) and `required`; the data gets `Files` with a `Get` method.
// guard.go changes only what Deckhouse would render as a bug, and only into a refusal.
package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"text/template"

	"github.com/BurntSushi/toml"
	"github.com/Masterminds/sprig/v3"
	"sigs.k8s.io/yaml"
)

// deckhouseFuncs is funcs.go's FuncMap: the late-bound include/tpl/required are placeholders
// here and bound per render (bindLateFuncs), as engine.go does.
func deckhouseFuncs() template.FuncMap {
	f := sprig.TxtFuncMap()
	delete(f, "env")
	delete(f, "expandenv")
	f["toToml"] = toTOML
	f["toYaml"] = toYAML
	f["fromYaml"] = fromYAML
	f["fromYamlArray"] = fromYAMLArray
	f["toJson"] = toJSON
	f["fromJson"] = fromJSON
	f["fromJsonArray"] = fromJSONArray
	f["include"] = func(string, interface{}) string { return "not implemented" }
	f["tpl"] = func(string, interface{}) interface{} { return "not implemented" }
	f["required"] = func(string, interface{}) (interface{}, error) { return "not implemented", nil }
	// No cluster access at render time: an empty map, never an error.
	f["lookup"] = func(string, string, string, string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil
	}
	return f
}

// Marshal errors become "" (toYaml, toJson) or the error text (toToml), inside the script.
func toYAML(v interface{}) string {
	data, err := yaml.Marshal(v)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(data), "\n")
}

func fromYAML(str string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := yaml.Unmarshal([]byte(str), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func fromYAMLArray(str string) []interface{} {
	a := []interface{}{}
	if err := yaml.Unmarshal([]byte(str), &a); err != nil {
		a = []interface{}{err.Error()}
	}
	return a
}

func toTOML(v interface{}) string {
	b := bytes.NewBuffer(nil)
	if err := toml.NewEncoder(b).Encode(v); err != nil {
		return err.Error()
	}
	return b.String()
}

func toJSON(v interface{}) string {
	data, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(data)
}

func fromJSON(str string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := json.Unmarshal([]byte(str), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func fromJSONArray(str string) []interface{} {
	a := []interface{}{}
	if err := json.Unmarshal([]byte(str), &a); err != nil {
		a = []interface{}{err.Error()}
	}
	return a
}

// Helm's `required` with its error markers (engine.go's warnWrap): the message reaches the user
// without the template's call-site prefix.
const (
	requiredStart = "HELM_ERR_START"
	requiredEnd   = "HELM_ERR_END"
)

type requiredError struct{ msg string }

func (e requiredError) Error() string { return requiredStart + e.msg + requiredEnd }

func required(warn string, val interface{}) (interface{}, error) {
	if val == nil {
		return val, requiredError{warn}
	}
	if s, ok := val.(string); ok && s == "" {
		return val, requiredError{warn}
	}
	return val, nil
}
