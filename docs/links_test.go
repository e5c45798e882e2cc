// Package docs holds the test that keeps the docs' links whole: every
// relative link of the README, CONTRIBUTING.md, the pages under docs/ and
// bench/results leads to a file of the repository, and a link to a
// heading of a markdown page (page.md#heading) to a heading it has.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/dflow-dev/dflow/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// link is a markdown link or image: [text](target) or ![text](target),
// the target up to a space (a title) or the closing parenthesis.
var link = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// pages are the markdown files whose links are checked, relative to the
// repository's root.
func pages(t *testing.T) []string {
	t.Helper()
	out := []string{"README.md", "CONTRIBUTING.md", "bench/results/README.md"}
	err := filepath.WalkDir("../docs", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, err := filepath.Rel("..", p)
			if err != nil {
				return err
			}
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// outsideCode returns the lines of a markdown page that are not in a
// fenced code block, with their numbers, and inline code taken out.
func outsideCode(src string) map[int]string {
	lines := map[int]string{}
	in := false
	code := regexp.MustCompile("`[^`]*`")
	for i, l := range strings.Split(src, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			in = !in
			continue
		}
		if !in {
			lines[i+1] = code.ReplaceAllString(l, "")
		}
	}
	return lines
}

// anchor is the id GitHub gives a heading: lower case, letters, digits,
// spaces, hyphens and underscores kept, spaces made hyphens.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// anchors returns the ids of a markdown page's headings.
func anchors(t *testing.T, page string) map[string]bool {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("..", page))
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	seen := map[string]int{}
	in := false
	for _, l := range strings.Split(string(src), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			in = !in
			continue
		}
		if in || !strings.HasPrefix(l, "#") {
			continue
		}
		id := anchor(strings.TrimSpace(strings.TrimLeft(l, "#")))
		if n := seen[id]; n > 0 {
			ids[id+"-"+string(rune('0'+n))] = true
		} else {
			ids[id] = true
		}
		seen[id]++
	}
	return ids
}

// TestRelativeLinks: every relative link of the pages leads to a file or
// folder of the repository, and one with a #heading to a heading of its
// page. A page renamed or a section retitled fails here, naming the page,
// the line and the link.
func TestRelativeLinks(t *testing.T) {
	t.Parallel()
	checked := 0
	for _, page := range pages(t) {
		src, err := os.ReadFile(filepath.Join("..", page))
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range outsideCode(string(src)) {
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, frag, _ := strings.Cut(target, "#")
				dest := page
				if file != "" {
					dest = filepath.ToSlash(filepath.Join(filepath.Dir(page), file))
					if _, err := os.Stat(filepath.Join("..", dest)); err != nil {
						t.Errorf("%s:%d: link %q: no file %s", page, n, target, dest)
						continue
					}
				}
				checked++
				if frag != "" && strings.HasSuffix(dest, ".md") && !anchors(t, dest)[frag] {
					t.Errorf("%s:%d: link %q: %s has no heading whose id is %q", page, n, target, dest, frag)
				}
			}
		}
	}
	if checked < 20 {
		t.Errorf("only %d relative links found: the pattern no longer matches the docs' links", checked)
	}
}
