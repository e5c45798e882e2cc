package graph

import (
	"fmt"
	"strings"

	"github.com/hashicorp/hcl/v2"

	"github.com/agext/levenshtein"
)

// DidYouMean returns `; did you mean "x"?` naming the closest candidate
// within a small edit distance, or "": the one suggestion every message of
// dflow's makes for a misspelt name (a stage, an edge, a config attribute,
// a variable, a policy, a node kind). A candidate PLUGIN/KIND is also the
// closest for its KIND alone, for PLUGIN, and for PLUGIN/KIND/..., so
// "crc" suggests "checksum/crc".
func DidYouMean(given string, candidates []string) string {
	best, bestDist := "", 3
	for _, c := range candidates {
		d := levenshtein.Distance(given, c, nil)
		if _, kind, ok := strings.Cut(c, "/"); ok && (kind == given || strings.HasPrefix(given, kind+"/") || strings.HasPrefix(c, given+"/")) {
			d = 0
		}
		if d < bestDist {
			best, bestDist = c, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf("; did you mean %q?", best)
}

// sentence ends a message with a period unless it ends with a question.
func sentence(s string) string {
	if strings.HasSuffix(s, "?") || strings.HasSuffix(s, ".") {
		return s
	}
	return s + "."
}

// at formats a range's start as FILE:LINE:COL.
func at(r hcl.Range) string {
	return fmt.Sprintf("%s:%d:%d", r.Filename, r.Start.Line, r.Start.Column)
}

// hinted joins a did-you-mean suggestion and a hint sentence (which starts
// with a space): `; did you mean "x"? Hint.` or `. Hint.`.
func hinted(suggestion, hint string) string {
	if suggestion == "" {
		return "." + hint
	}
	return suggestion + hint
}
