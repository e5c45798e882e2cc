package graph

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/typeexpr"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
)

// variable is one `variable` block with its resolved value.
type variable struct {
	name     string
	typ      cty.Type // cty.DynamicPseudoType when neither type nor default says
	value    cty.Value
	declared hcl.Range
	invalid  bool // a bad default or value was already reported
}

var variableSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "default"},
		{Name: "type"},
		{Name: "description"},
	},
}

// evalContext resolves the variables (defaults, then var files, then
// --var) and returns the context stage and edge expressions see: `var.NAME`.
func (d *decoder) evalContext(blocks []*hcl.Block) *hcl.EvalContext {
	vars := map[string]*variable{}
	var order []string
	for _, b := range blocks {
		if !d.unique(b) {
			continue
		}
		v := d.decodeVariable(b)
		vars[v.name] = v
		order = append(order, v.name)
	}
	for _, path := range d.loader.VarFiles {
		d.applyVarFile(path, vars)
	}
	names := slices.Sorted(maps.Keys(d.loader.Vars))
	for _, name := range names {
		d.applyVar(name, d.loader.Vars[name], vars)
	}
	values := map[string]cty.Value{}
	for _, name := range order {
		v := vars[name]
		if v.value == cty.NilVal {
			if !v.invalid {
				d.errorf(v.declared, "variable not set",
					"variable %q has no default; set it with --var %s=VALUE or in a --var-file.", name, name)
			}
			values[name] = cty.DynamicVal
			continue
		}
		values[name] = v.value
	}
	return &hcl.EvalContext{Variables: map[string]cty.Value{"var": cty.ObjectVal(values)}}
}

func (d *decoder) decodeVariable(b *hcl.Block) *variable {
	v := &variable{name: b.Labels[0], typ: cty.DynamicPseudoType, declared: b.LabelRanges[0]}
	content, diags := b.Body.Content(variableSchema)
	d.diags = append(d.diags, diags...)
	if a, ok := content.Attributes["type"]; ok {
		t, diags := typeexpr.TypeConstraint(a.Expr)
		d.diags = append(d.diags, diags...)
		if !diags.HasErrors() {
			v.typ = t
		}
	}
	if a, ok := content.Attributes["default"]; ok {
		val, diags := a.Expr.Value(nil)
		d.diags = append(d.diags, diags...)
		if diags.HasErrors() {
			return v
		}
		if v.typ == cty.DynamicPseudoType {
			v.typ = val.Type()
		}
		cv, err := convertValue(val, v.typ)
		if err != nil {
			d.errorf(a.Expr.Range(), "invalid default",
				"variable %q: the default is %s, which is not of type %s.", v.name, describe(val), v.typ.FriendlyName())
			v.invalid = true
			return v
		}
		v.value = cv
	}
	return v
}

func (d *decoder) applyVarFile(path string, vars map[string]*variable) {
	var file *hcl.File
	var diags hcl.Diagnostics
	if src, err := os.ReadFile(path); err == nil {
		if nt := NotText(path, src); nt != nil {
			d.diags = append(d.diags, nt) // one error, not one per stray byte
			return
		}
	}
	if strings.HasSuffix(path, ".json") {
		file, diags = d.loader.parser.ParseJSONFile(path)
	} else {
		file, diags = d.loader.parser.ParseHCLFile(path)
	}
	d.diags = append(d.diags, diags...)
	if file == nil || diags.HasErrors() {
		return
	}
	attrs, diags := file.Body.JustAttributes()
	d.diags = append(d.diags, diags...)
	for name, a := range attrs {
		v, ok := vars[name]
		if !ok {
			d.errorf(a.NameRange, "undeclared variable",
				"%s", sentence(fmt.Sprintf("%s sets variable %q, which %s does not declare%s", path, name, d.filename, DidYouMean(name, slices.Sorted(maps.Keys(vars))))))
			continue
		}
		val, diags := a.Expr.Value(nil)
		d.diags = append(d.diags, diags...)
		if diags.HasErrors() {
			continue
		}
		cv, err := convertValue(val, v.typ)
		if err != nil {
			d.errorf(a.Expr.Range(), "invalid value for variable",
				"variable %q wants %s; got %s.", name, v.typ.FriendlyName(), describe(val))
			continue
		}
		v.value = cv
	}
}

func (d *decoder) applyVar(name, raw string, vars map[string]*variable) {
	v, ok := vars[name]
	if !ok {
		d.diags = append(d.diags, &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  "undeclared variable",
			Detail: sentence(fmt.Sprintf("--var %s=%s: %s declares no variable %q%s",
				name, raw, d.filename, name, DidYouMean(name, slices.Sorted(maps.Keys(vars))))),
		})
		return
	}
	val, err := ParseValue(raw, v.typ)
	if err != nil {
		d.diags = append(d.diags, &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  "invalid value for variable",
			Detail:   fmt.Sprintf("--var %s=%s: %v.", name, raw, err),
		})
		return
	}
	v.value = val
}

// ParseValue reads a command-line value (--var, --set) as the given type.
// Strings, numbers and bools are taken literally; a list or other complex
// type is parsed as an HCL expression ("[1, 0.5]"). With no type known, a
// constant HCL expression gives its own type and anything else is a
// string.
func ParseValue(raw string, want cty.Type) (cty.Value, error) {
	if want.IsPrimitiveType() {
		v, err := convert.Convert(cty.StringVal(raw), want)
		if err != nil {
			return cty.NilVal, fmt.Errorf("want %s", want.FriendlyName())
		}
		return v, nil
	}
	expr, diags := hclsyntax.ParseExpression([]byte(raw), "value", hcl.InitialPos)
	if !diags.HasErrors() {
		v, diags := expr.Value(nil)
		if !diags.HasErrors() {
			cv, err := convertValue(v, want)
			if err != nil {
				return cty.NilVal, fmt.Errorf("want %s; got %s", want.FriendlyName(), describe(v))
			}
			return cv, nil
		}
	}
	if want == cty.DynamicPseudoType {
		return cty.StringVal(raw), nil
	}
	return cty.NilVal, fmt.Errorf("want %s written as HCL, such as [1, 2]", want.FriendlyName())
}

func convertValue(v cty.Value, want cty.Type) (cty.Value, error) {
	if want == cty.DynamicPseudoType {
		return v, nil
	}
	return convert.Convert(v, want)
}

// describe names a value's type for messages: `a string ("x")`.
func describe(v cty.Value) string {
	if v.IsNull() {
		return "null"
	}
	if !v.IsKnown() {
		return "an unknown value"
	}
	switch v.Type() {
	case cty.String:
		return fmt.Sprintf("the string %q", v.AsString())
	case cty.Number:
		return "the number " + v.AsBigFloat().Text('g', -1)
	case cty.Bool:
		return fmt.Sprintf("the bool %t", v.True())
	}
	return v.Type().FriendlyName()
}
