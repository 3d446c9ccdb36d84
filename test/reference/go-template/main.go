// Reference renderer for the differential tests: Deckhouse's bashible-apiserver template engine
// as it renders NodeGroupConfiguration content (pkg/template/engine.go and funcs.go of
// modules/040-node-manager/images/bashible-apiserver, at the module versions its go.sum pins),
// with no guard of ours: sprig v3 without env/expandenv; toYaml, toToml, fromYaml,
// fromYamlArray, toJson, fromJson, fromJsonArray; `lookup` an empty map; `include` returning
// "NotImplemented"; `tpl` rendering a string with the root data in a clone of the template set;
// `required`; `.Files.Get` reading the server's files. Data is decoded from JSON, as Deckhouse's
// context is (numbers are float64).
//
// Reads a JSON array of {name, template, data} on stdin, writes a JSON array of {out} or {err}.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"text/template"

	"github.com/BurntSushi/toml"
	"github.com/Masterminds/sprig/v3"
	"github.com/mitchellh/copystructure"
	"sigs.k8s.io/yaml"
)

type testCase struct {
	Name     string                 `json:"name"`
	Template string                 `json:"template"`
	Data     map[string]interface{} `json:"data"`
}

type result struct {
	Out *string `json:"out,omitempty"`
	Err *string `json:"err,omitempty"`
}

func funcMap() template.FuncMap {
	f := sprig.TxtFuncMap()
	delete(f, "env")
	delete(f, "expandenv")
	f["toToml"] = func(v interface{}) string {
		b := bytes.NewBuffer(nil)
		if err := toml.NewEncoder(b).Encode(v); err != nil {
			return err.Error()
		}
		return b.String()
	}
	f["toYaml"] = func(v interface{}) string {
		data, err := yaml.Marshal(v)
		if err != nil {
			return ""
		}
		return strings.TrimSuffix(string(data), "\n")
	}
	f["fromYaml"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := yaml.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	f["fromYamlArray"] = func(s string) []interface{} {
		a := []interface{}{}
		if err := yaml.Unmarshal([]byte(s), &a); err != nil {
			a = []interface{}{err.Error()}
		}
		return a
	}
	f["toJson"] = func(v interface{}) string {
		data, err := json.Marshal(v)
		if err != nil {
			return ""
		}
		return string(data)
	}
	f["fromJson"] = func(s string) map[string]interface{} {
		m := map[string]interface{}{}
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			m["Error"] = err.Error()
		}
		return m
	}
	f["fromJsonArray"] = func(s string) []interface{} {
		a := []interface{}{}
		if err := json.Unmarshal([]byte(s), &a); err != nil {
			a = []interface{}{err.Error()}
		}
		return a
	}
	f["lookup"] = func(string, string, string, string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil
	}
	return f
}

type engine struct {
	name string
	data map[string]interface{}
}

func (e engine) bind(t *template.Template) {
	f := funcMap()
	f["include"] = func(string, interface{}) (string, error) { return "NotImplemented", nil }
	f["tpl"] = func(text string, vals map[string]interface{}) (string, error) {
		clone, err := t.Clone()
		if err != nil {
			return "", fmt.Errorf("clone template failed: %v", err)
		}
		out, err := e.render(text, clone)
		if err != nil {
			return "", fmt.Errorf("error during tpl function execution for %q: %w", text, err)
		}
		return out, nil
	}
	f["required"] = func(warn string, val interface{}) (interface{}, error) {
		if val == nil {
			return val, errors.New("HELM_ERR_START" + warn + "HELM_ERR_END")
		} else if s, ok := val.(string); ok && s == "" {
			return val, errors.New("HELM_ERR_START" + warn + "HELM_ERR_END")
		}
		return val, nil
	}
	t.Funcs(f)
}

func (e engine) render(text string, t *template.Template) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("rendering template failed: %v", r)
		}
	}()
	e.bind(t)
	if _, err := t.New(e.name).Parse(text); err != nil {
		return "", err
	}
	copied, err := copystructure.Copy(e.data)
	if err != nil {
		return "", err
	}
	data := copied.(map[string]interface{})
	data["Files"] = files{}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, e.name, data); err != nil {
		return "", err
	}
	return buf.String(), nil
}

// Helm's .Files.Get as Deckhouse mocks it: a file of the server's own file system.
type files struct{}

func (files) Get(path string) (string, error) {
	b, err := os.ReadFile(path)
	return string(b), err
}

func main() {
	// -funcs: the function names a template can call (sprig's and Deckhouse's, not Go's builtins).
	if len(os.Args) > 1 && os.Args[1] == "-funcs" {
		names := []string{"include", "tpl", "required"}
		for name := range funcMap() {
			names = append(names, name)
		}
		sort.Strings(names)
		_ = json.NewEncoder(os.Stdout).Encode(names)
		return
	}
	var cases []testCase
	if err := json.NewDecoder(os.Stdin).Decode(&cases); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(2)
	}
	results := make([]result, 0, len(cases))
	for _, c := range cases {
		if c.Data == nil {
			c.Data = map[string]interface{}{}
		}
		name := c.Name
		if name == "" {
			name = "ngc"
		}
		out, err := engine{name: name, data: c.Data}.render(c.Template, template.New(name))
		if err != nil {
			msg := err.Error()
			results = append(results, result{Err: &msg})
		} else {
			results = append(results, result{Out: &out})
		}
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(results); err != nil {
		os.Exit(2)
	}
}
