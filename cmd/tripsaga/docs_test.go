package main

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"
	"github.com/yuin/goldmark"
	"github.com/yuin/goldmark/ast"
	"github.com/yuin/goldmark/extension"
	"github.com/yuin/goldmark/text"
)

// TestDocsLinks (issue 18): the README is a front page and the rest lives
// in docs/, so every relative link must survive the move. Every link and
// image of README.md, the other top-level pages and docs/**/*.md that is
// not a URL must name a file or folder of the repository, a #fragment on
// a Markdown page must name one of its headings (GitHub's heading ids),
// every page under docs/ must be reachable from README.md by following
// links, and every section (## heading) of a page under docs/ but the
// contracts must be linked by its id from README.md or docs/README.md, so
// no section the README used to hold is lost from its index.
func TestDocsLinks(t *testing.T) {
	root := filepath.Join("..", "..")
	pages := docPages(t, root)
	require.Contains(t, pages, "README.md")
	require.Contains(t, pages, "docs/README.md")
	problems := checkLinks(root, pages)
	for _, p := range problems {
		t.Error(p)
	}
}

// TestDocsLinksFindsBrokenLinks proves the checker of TestDocsLinks on a
// tree made for it: each kind of broken link, a page no link reaches and
// a section no index links are reported, and what is fine (URLs, code, a
// repeated heading's -1 id, a folder, an image, a ### subsection) is not.
func TestDocsLinksFindsBrokenLinks(t *testing.T) {
	root := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		p := filepath.Join(root, filepath.FromSlash(name))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
	}
	write("README.md", "# Front\n\n"+
		"[ok](docs/a.md#the-rules-and-where-they-live) [dir](saga) [img](docs/pic.png) [index](docs/README.md)\n"+
		"[web](https://example.com/x.md) [mail](mailto:a@example.com) `[code](gone.md)`\n\n"+
		"```\n[fenced](gone.md)\n```\n\n"+
		"[missing file](docs/gone.md) [missing anchor](docs/a.md#no-such-heading)\n"+
		"[own anchor](#front) [own missing](#back) [escape](../outside.md)\n\n"+
		"| a | b |\n|---|---|\n| [in a table](docs/nope.md) | x |\n")
	write("docs/a.md", "# A\n\n## The rules, and where they live\n\n## Twice\n\n## Twice\n\n"+
		"[second twice](#twice-1) [up](../README.md#front) [code file](../saga/x.go#L3)\n")
	write("docs/pic.png", "png")
	write("docs/orphan.md", "# Nobody links here\n")
	write("docs/README.md", "# Index\n\n[b](b.md#linked)\n")
	write("docs/b.md", "# B\n\n## Linked\n\n## Not linked\n\n### A subsection needs no link\n")
	write("saga/x.go", "package saga\n")

	got := checkLinks(root, []string{"README.md", "docs/a.md", "docs/orphan.md", "docs/README.md", "docs/b.md"})
	require.ElementsMatch(t, []string{
		`README.md: link "docs/gone.md": no such file or folder`,
		`README.md: link "docs/a.md#no-such-heading": docs/a.md has no heading with id "no-such-heading"`,
		`README.md: link "#back": README.md has no heading with id "back"`,
		`README.md: link "../outside.md": leaves the repository`,
		`README.md: link "docs/nope.md": no such file or folder`,
		`docs/orphan.md: not reachable by links from README.md`,
		`docs/a.md: section #twice is linked from neither README.md nor docs/README.md`,
		`docs/a.md: section #twice-1 is linked from neither README.md nor docs/README.md`,
		`docs/b.md: section #not-linked is linked from neither README.md nor docs/README.md`,
	}, got)
}

// docPages lists the Markdown pages TestDocsLinks checks, slash-separated
// and relative to root: the top-level *.md and every *.md under docs/.
func docPages(t *testing.T, root string) []string {
	t.Helper()
	top, err := filepath.Glob(filepath.Join(root, "*.md"))
	require.NoError(t, err)
	var pages []string
	for _, p := range top {
		pages = append(pages, filepath.Base(p))
	}
	err = filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			pages = append(pages, filepath.ToSlash(rel))
		}
		return nil
	})
	require.NoError(t, err)
	slices.Sort(pages)
	return pages
}

// mdPage is what checkLinks reads of one Markdown page.
type mdPage struct {
	links    []string        // every link and image destination, as written
	ids      map[string]bool // the heading ids GitHub gives its headings
	sections []string        // the ids of its level-2 headings, in order
}

// checkLinks reads pages (slash-separated, relative to root) and returns
// one line per problem: a relative link to a file or folder that does not
// exist or lies outside root, a #fragment that names no heading of its
// Markdown target, a page under docs/ that no chain of links from
// README.md reaches, and a section (## heading) of a page under docs/
// (but the contracts and the index itself) that neither README.md nor
// docs/README.md links by its id. Links with a scheme (https:, mailto:) are not
// followed; links in code spans and code blocks are not links.
func checkLinks(root string, pages []string) []string {
	md := goldmark.New(goldmark.WithExtensions(extension.GFM))
	read := map[string]*mdPage{}
	var problems []string
	load := func(name string) (*mdPage, error) {
		if p, ok := read[name]; ok {
			return p, nil
		}
		src, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
		if err != nil {
			return nil, err
		}
		p := parsePage(md, src)
		read[name] = p
		return p, nil
	}
	linksTo := map[string][]string{} // page -> the Markdown pages it links to
	for _, name := range pages {
		page, err := load(name)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		for _, dest := range page.links {
			target, ok, problem := resolveLink(root, name, dest)
			if problem != "" {
				problems = append(problems, fmt.Sprintf("%s: link %q: %s", name, dest, problem))
				continue
			}
			if !ok {
				continue
			}
			file, fragment, _ := strings.Cut(target, "#")
			if !strings.HasSuffix(file, ".md") {
				continue
			}
			linksTo[name] = append(linksTo[name], file)
			if fragment == "" {
				continue
			}
			tp, err := load(file)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: link %q: %v", name, dest, err))
				continue
			}
			if !tp.ids[fragment] {
				problems = append(problems, fmt.Sprintf("%s: link %q: %s has no heading with id %q", name, dest, file, fragment))
			}
		}
	}
	reached := map[string]bool{"README.md": true}
	for queue := []string{"README.md"}; len(queue) > 0; queue = queue[1:] {
		for _, next := range linksTo[queue[0]] {
			if !reached[next] {
				reached[next] = true
				queue = append(queue, next)
			}
		}
	}
	for _, name := range pages {
		if strings.HasPrefix(name, "docs/") && !reached[name] {
			problems = append(problems, fmt.Sprintf("%s: not reachable by links from README.md", name))
		}
	}
	indexed := map[string]bool{} // page#id linked from an index
	for _, index := range []string{"README.md", "docs/README.md"} {
		page, ok := read[index]
		if !ok {
			continue
		}
		for _, dest := range page.links {
			if target, ok, _ := resolveLink(root, index, dest); ok {
				indexed[target] = true
			}
		}
	}
	for _, name := range pages {
		page, ok := read[name]
		if !ok || !strings.HasPrefix(name, "docs/") || strings.HasPrefix(name, "docs/contracts/") || name == "docs/README.md" {
			continue
		}
		for _, id := range page.sections {
			if !indexed[name+"#"+id] {
				problems = append(problems, fmt.Sprintf("%s: section #%s is linked from neither README.md nor docs/README.md", name, id))
			}
		}
	}
	return problems
}

// resolveLink resolves dest, a link written on page from (relative to
// root), to a slash-separated path relative to root with its #fragment,
// if any (a fragment alone names from itself). ok is false for a link
// that is not checked (a URL); problem says why a checked link is broken.
func resolveLink(root, from, dest string) (target string, ok bool, problem string) {
	u, err := url.Parse(dest)
	if err != nil {
		return "", false, fmt.Sprintf("not a URL reference: %v", err)
	}
	if u.Scheme != "" || u.Host != "" {
		return "", false, ""
	}
	file := from
	if u.Path != "" {
		file = path.Join(path.Dir(from), u.Path)
		if file == ".." || strings.HasPrefix(file, "../") || path.IsAbs(u.Path) {
			return "", false, "leaves the repository"
		}
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(file))); err != nil {
			return "", false, "no such file or folder"
		}
	}
	if u.Fragment != "" {
		return file + "#" + u.Fragment, true, ""
	}
	return file, true, ""
}

// parsePage collects the link and image destinations of a Markdown page
// and the ids GitHub gives its headings.
func parsePage(md goldmark.Markdown, src []byte) *mdPage {
	doc := md.Parser().Parse(text.NewReader(src))
	page := &mdPage{ids: map[string]bool{}}
	seen := map[string]int{}
	_ = ast.Walk(doc, func(n ast.Node, entering bool) (ast.WalkStatus, error) {
		if !entering {
			return ast.WalkContinue, nil
		}
		switch n := n.(type) {
		case *ast.Link:
			page.links = append(page.links, string(n.Destination))
		case *ast.Image:
			page.links = append(page.links, string(n.Destination))
		case *ast.Heading:
			base := headingID(plainText(n, src))
			id := base
			if k := seen[base]; k > 0 {
				id = fmt.Sprintf("%s-%d", base, k)
			}
			seen[base]++
			page.ids[id] = true
			if n.Level == 2 {
				page.sections = append(page.sections, id)
			}
		}
		return ast.WalkContinue, nil
	})
	return page
}

// plainText is the text of n and its descendants, code spans included,
// with no markup.
func plainText(n ast.Node, src []byte) string {
	var b strings.Builder
	for c := n.FirstChild(); c != nil; c = c.NextSibling() {
		switch c := c.(type) {
		case *ast.Text:
			b.Write(c.Segment.Value(src))
			if c.SoftLineBreak() || c.HardLineBreak() {
				b.WriteByte(' ')
			}
		case *ast.String:
			b.Write(c.Value)
		default:
			b.WriteString(plainText(c, src))
		}
	}
	return b.String()
}

// headingID is the id GitHub gives a heading of that text (github-slugger):
// lower case, every character but letters, digits, marks, '-' and '_'
// dropped, each space a '-'. A repeated id gets -1, -2... (parsePage).
func headingID(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(s)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
