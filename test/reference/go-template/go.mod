module bashible.test/go-template-reference

go 1.24

// Deckhouse's bashible-apiserver pins (modules/040-node-manager/images/bashible-apiserver/go.sum):
// the same sprig, semver, yaml and toml give the same output.
require (
	github.com/BurntSushi/toml v0.3.1
	github.com/Masterminds/sprig/v3 v3.2.0
	github.com/mitchellh/copystructure v1.2.0
	sigs.k8s.io/yaml v1.3.0
)

require (
	github.com/Masterminds/goutils v1.1.0 // indirect
	github.com/Masterminds/semver/v3 v3.1.1 // indirect
	github.com/google/uuid v1.3.0 // indirect
	github.com/huandu/xstrings v1.3.1 // indirect
	github.com/imdario/mergo v0.3.11 // indirect
	github.com/mitchellh/reflectwalk v1.0.2 // indirect
	github.com/shopspring/decimal v1.2.0 // indirect
	github.com/spf13/cast v1.3.1 // indirect
	golang.org/x/crypto v0.6.0 // indirect
	gopkg.in/yaml.v2 v2.4.0 // indirect
)
