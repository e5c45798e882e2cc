module github.com/dflow-dev/dflow

go 1.26

require (
	github.com/agext/levenshtein v1.2.1
	github.com/hashicorp/hcl/v2 v2.25.0
	github.com/zclconf/go-cty v1.20.0
)

require (
	github.com/apparentlymart/go-textseg/v15 v15.0.0 // indirect
	github.com/apparentlymart/go-textseg/v17 v17.0.1 // indirect
	github.com/google/go-cmp v0.6.0 // indirect
	github.com/mitchellh/go-wordwrap v1.0.1 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/mod v0.29.0 // indirect
	golang.org/x/sync v0.18.0 // indirect
	golang.org/x/text v0.31.0 // indirect
	golang.org/x/tools v0.38.0 // indirect
)
