package graph

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hcled"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// WriteDiagnostics prints diagnostics for people, each as
//
//	FILE:LINE:COL: error: SUMMARY
//	  DETAIL
//
//	   12 |   from = targt.hidden
//	      |          ^^^^^
//
// sources maps file names to their bytes (Loader.Sources); a diagnostic
// whose file is missing is printed without a snippet.
func WriteDiagnostics(w io.Writer, diags hcl.Diagnostics, sources map[string][]byte) error {
	var b strings.Builder
	for i, d := range diags {
		if i > 0 {
			b.WriteByte('\n')
		}
		sev := "error"
		if d.Severity == hcl.DiagWarning {
			sev = "warning"
		}
		if d.Subject != nil {
			fmt.Fprintf(&b, "%s:%d:%d: ", d.Subject.Filename, d.Subject.Start.Line, d.Subject.Start.Column)
		}
		fmt.Fprintf(&b, "%s: %s\n", sev, d.Summary)
		if d.Detail != "" {
			fmt.Fprintf(&b, "  %s\n", d.Detail)
		}
		if d.Subject != nil {
			if snip := snippet(d, sources[d.Subject.Filename]); snip != "" {
				b.WriteString("\n" + snip)
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// snippet renders the lines of the diagnostic's context (or subject) with
// the subject underlined.
func snippet(d *hcl.Diagnostic, src []byte) string {
	if len(src) == 0 {
		return ""
	}
	subj := *d.Subject
	ctx := subj
	if d.Context != nil {
		ctx = *d.Context
	}
	lines := bytes.Split(src, []byte("\n"))
	first, last := ctx.Start.Line, min(ctx.End.Line, ctx.Start.Line+4)
	if first < 1 || first > len(lines) {
		return ""
	}
	last = min(max(last, first), len(lines))
	var b strings.Builder
	for n := first; n <= last; n++ {
		line := strings.TrimRight(string(lines[n-1]), "\r")
		fmt.Fprintf(&b, "  %4d | %s\n", n, line)
		if n != subj.Start.Line {
			continue
		}
		n := utf8.RuneCountInString(line)
		startCol := min(max(subj.Start.Column-1, 0), n)
		width := n - startCol
		if subj.End.Line == subj.Start.Line {
			width = subj.End.Column - subj.Start.Column
		}
		fmt.Fprintf(&b, "       | %s%s\n", strings.Repeat(" ", startCol), strings.Repeat("^", max(width, 1)))
	}
	return b.String()
}

// JSON diagnostics, shaped like `terraform validate -json`.
type jsonReport struct {
	FormatVersion string     `json:"format_version"`
	Valid         bool       `json:"valid"`
	ErrorCount    int        `json:"error_count"`
	WarningCount  int        `json:"warning_count"`
	Diagnostics   []jsonDiag `json:"diagnostics"`
}

type jsonDiag struct {
	Severity string       `json:"severity"`
	Summary  string       `json:"summary"`
	Detail   string       `json:"detail"`
	Range    *jsonRange   `json:"range,omitempty"`
	Snippet  *jsonSnippet `json:"snippet,omitempty"`
}

type jsonRange struct {
	Filename string  `json:"filename"`
	Start    jsonPos `json:"start"`
	End      jsonPos `json:"end"`
}

type jsonPos struct {
	Line   int `json:"line"`
	Column int `json:"column"`
	Byte   int `json:"byte"`
}

type jsonSnippet struct {
	Context              *string `json:"context"`
	Code                 string  `json:"code"`
	StartLine            int     `json:"start_line"`
	HighlightStartOffset int     `json:"highlight_start_offset"`
	HighlightEndOffset   int     `json:"highlight_end_offset"`
	Values               []any   `json:"values"`
}

// WriteDiagnosticsJSON writes diagnostics as one JSON object in the shape
// of `terraform validate -json`.
func WriteDiagnosticsJSON(w io.Writer, diags hcl.Diagnostics, sources map[string][]byte) error {
	rep := jsonReport{FormatVersion: "1.0", Diagnostics: []jsonDiag{}}
	files := map[string]*hcl.File{} // parsed once each, for the snippets' context
	for _, d := range diags {
		jd := jsonDiag{Severity: "error", Summary: d.Summary, Detail: d.Detail}
		if d.Severity == hcl.DiagWarning {
			jd.Severity = "warning"
			rep.WarningCount++
		} else {
			rep.ErrorCount++
		}
		if s := d.Subject; s != nil {
			jd.Range = &jsonRange{
				Filename: s.Filename,
				Start:    jsonPos{s.Start.Line, s.Start.Column, s.Start.Byte},
				End:      jsonPos{s.End.Line, s.End.Column, s.End.Byte},
			}
			jd.Snippet = jsonSnippetFor(*s, sources[s.Filename])
			if jd.Snippet != nil {
				jd.Snippet.Context = blockContext(files, s.Filename, sources[s.Filename], s.Start.Byte)
			}
		}
		rep.Diagnostics = append(rep.Diagnostics, jd)
	}
	rep.Valid = rep.ErrorCount == 0
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// blockContext names the top-level block enclosing the byte offset, as
// Terraform's snippet.context does (`edge "hs"`), or nil outside any
// block. Like Terraform it looks at the byte before the subject, so that
// a subject which is a block's header names that block.
func blockContext(files map[string]*hcl.File, name string, src []byte, offset int) *string {
	f, ok := files[name]
	if !ok {
		f, _ = hclsyntax.ParseConfig(src, name, hcl.InitialPos) // a file with errors still yields its blocks
		files[name] = f
	}
	if f == nil {
		return nil
	}
	if ctx := hcled.ContextString(f, offset-1); ctx != "" {
		return &ctx
	}
	return nil
}

func jsonSnippetFor(r hcl.Range, src []byte) *jsonSnippet {
	if r.Start.Byte > len(src) || r.End.Byte > len(src) || r.Start.Byte > r.End.Byte {
		return nil
	}
	start := bytes.LastIndexByte(src[:r.Start.Byte], '\n') + 1
	end := len(src)
	if i := bytes.IndexByte(src[r.End.Byte:], '\n'); i >= 0 {
		end = r.End.Byte + i
	}
	return &jsonSnippet{
		Code:                 string(src[start:end]),
		StartLine:            r.Start.Line,
		HighlightStartOffset: r.Start.Byte - start,
		HighlightEndOffset:   r.End.Byte - start,
		Values:               []any{},
	}
}
