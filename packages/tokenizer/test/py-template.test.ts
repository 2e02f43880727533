// Undefined values as jinja2's default Undefined (transformers' ImmutableSandboxedEnvironment sets no other), each
// expectation what jinja2 3.1 gives; a dict's pairs and views, dictsort's; join's attribute; the bound on a render's work.
import { describe, expect, test } from "bun:test";
import { runTemplate, type ChatTemplate } from "../src/chat-template";
import { ChatUnrenderable } from "../src/messages";
import { PyTemplate, RenderBoundExceeded, TemplateRaised, type RenderCost } from "../src/py-template";

const render = (source: string, vars: Record<string, unknown> = {}) => new PyTemplate(source).render(vars);

describe("an undefined value", () => {
  test("prints as nothing, is not defined, and an attribute of None is one", () => {
    expect(render("[{{ x }}]")).toBe("[]");
    expect(render("{{ x is defined }}")).toBe("False");
    expect(render("[{{ n.a }}]", { n: null })).toBe("[]");
    expect(render("[{{ d.a }}]", { d: {} })).toBe("[]");
  });

  test("raises UndefinedError when an attribute or item of it is read", () => {
    expect(() => render("{{ x.a }}")).toThrow(TemplateRaised);
    expect(() => render("{{ x['a'] }}")).toThrow(TemplateRaised);
    expect(() => render("{{ d.a.b }}", { d: {} })).toThrow(TemplateRaised);
    expect(() => render("{{ n.a.b }}", { n: null })).toThrow(TemplateRaised);
    expect(() => render("{{ l[3].b }}", { l: [1] })).toThrow(TemplateRaised);
    // The attribute is read before the test: jinja2 raises on `x.a is defined` too.
    expect(() => render("{{ x.a is defined }}")).toThrow(TemplateRaised);
  });

  test("raises json.dumps' TypeError through tojson, where it printed null", () => {
    expect(() => render("{{ x | tojson }}")).toThrow(TemplateRaised);
    expect(() => render("{{ t.name | tojson }}", { t: { function: { name: "f" } } })).toThrow(TemplateRaised);
    expect(render("{{ n | tojson }} {{ d.get('z') | tojson }}", { n: null, d: {} })).toBe("null null");
  });
});

describe("dictsort", () => {
  const d = { b: 2, a: 1, C: 3 };

  test("gives (key, value) tuples, printed as Python prints them and as lists by tojson", () => {
    expect(render("{{ d | dictsort }}", { d: { b: 2, a: 1 } })).toBe("[('a', 1), ('b', 2)]");
    expect(render("{{ d | dictsort | tojson }}", { d: { b: 2, a: 1 } })).toBe('[["a", 1], ["b", 2]]');
    expect(render("{{ (d | dictsort)[0] }}", { d: { b: 2, a: 1 } })).toBe("('a', 1)");
  });

  test("unpacks in a for loop, and takes case_sensitive, by and reverse as jinja2 does", () => {
    expect(render("{% for k, v in d | dictsort %}{{ k }}={{ v }};{% endfor %}", { d })).toBe("a=1;b=2;C=3;");
    expect(render("{{ d | dictsort(true) }}", { d })).toBe("[('C', 3), ('a', 1), ('b', 2)]");
    expect(render("{{ d | dictsort(case_sensitive=true) }}", { d })).toBe("[('C', 3), ('a', 1), ('b', 2)]");
    expect(render("{{ d | dictsort(by='value', reverse=true) }}", { d })).toBe("[('C', 3), ('b', 2), ('a', 1)]");
    expect(render("{{ d | dictsort(false, 'value') }}", { d })).toBe("[('a', 1), ('b', 2), ('C', 3)]");
  });
});

describe("a dict's items(), keys() and values()", () => {
  const d = { a: 1, b: "x" };

  test("items() and the items filter give (key, value) tuples: printed as Python prints them, lists by tojson, unpacked in a loop", () => {
    expect(render("{% for p in d.items() %}{{ p }} {{ p | string }} {{ p ~ '' }} {{ [p] }} {{ p | tojson }} {{ p is sequence }} {{ p | join('=') }};{% endfor %}", { d }))
      .toBe(`('a', 1) ('a', 1) ('a', 1) [('a', 1)] ["a", 1] True a=1;('b', 'x') ('b', 'x') ('b', 'x') [('b', 'x')] ["b", "x"] True b=x;`);
    expect(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}", { d })).toBe("a=1;b=x;a=1;b=x;");
    expect(render("{{ d.items() | list }} {{ d | items | list }} {{ d.items() | first }} {{ (d.items() | list)[0] | list }} {{ (1, 2) | list }}", { d }))
      .toBe("[('a', 1), ('b', 'x')] [('a', 1), ('b', 'x')] ('a', 1) ['a', 1] [1, 2]");
  });

  test("are views: printed dict_keys([...]), made lists by list, refused by tojson (json.dumps' TypeError)", () => {
    expect(render("{{ d.keys() }} {{ d.values() }} {{ d.items() }} {{ [d.keys()] }} {{ d.keys() | string }} {{ d.keys() ~ '' }}", { d }))
      .toBe("dict_keys(['a', 'b']) dict_values([1, 'x']) dict_items([('a', 1), ('b', 'x')]) [dict_keys(['a', 'b'])] dict_keys(['a', 'b']) dict_keys(['a', 'b'])");
    expect(render("{{ d.keys() | list }} {{ d.values() | list | tojson }} {{ d.keys() | join(',') }} {{ d.keys() | length }} {{ 'a' in d.keys() }}", { d }))
      .toBe(`['a', 'b'] [1, "x"] a,b 2 True`);
    expect(() => render("{{ d.keys() | tojson }}", { d })).toThrow(TemplateRaised);
  });

  test("the items filter is a generator: read as jinja2 reads it, no length, JSON or last item, and printing one is no render of ours", () => {
    expect(render("{% for k, v in d | items %}{{ loop.index }}/{{ loop.length }} {{ k }}={{ v }};{% endfor %}", { d })).toBe("1/2 a=1;2/2 b=x;");
    expect(render("{{ d | items | first }} {{ d | items | join('|') }} {{ d | items | reverse | list }}", { d })).toBe("('a', 1) ('a', 1)|('b', 'x') [('b', 'x'), ('a', 1)]");
    // Undefined gives no pairs, and a generator is true even when empty.
    expect(render("[{% for k, v in x | items %}{{ k }}{% endfor %}] {{ x | items | list }} {% if x | items %}T{% endif %}")).toBe("[] [] T");
    for (const f of ["length", "count", "tojson", "tojson(indent=2)", "last"]) {
      expect(() => render(`{{ d | items | ${f} }}`, { d })).toThrow(TemplateRaised);
      expect(() => render(`{{ x | items | ${f} }}`)).toThrow(TemplateRaised);
    }
    // Of a non-mapping: TypeError once read, not before.
    for (const v of [5, [1], "ab", null]) {
      expect(() => render("{{ v | items | list }}", { v })).toThrow(TemplateRaised);
      expect(() => render("{% for p in v | items %}{% endfor %}", { v })).toThrow(TemplateRaised);
      expect(() => render("{{ v | items | first }}", { v })).toThrow(TemplateRaised);
      expect(render("{% if v | items %}T{% endif %}", { v })).toBe("T");
    }
    // jinja2 prints `<generator object do_items at 0x7f...>`: an address vLLM's render has and ours cannot.
    const compiled = (source: string): ChatTemplate => ({ source, compiled: new PyTemplate(source), contentFormat: "string" });
    for (const source of ["{{ d | items }}", "{{ [d | items] }}", "{{ d | items | string }}", "{{ d | items ~ '' }}"]) {
      expect(() => runTemplate(compiled(source), { d })).toThrow(ChatUnrenderable);
    }
  });
});

test("join(attribute=) joins str() of each item's attribute, a dotted path or an index, as jinja2 reads it", () => {
  const vars = { xs: [{ a: { b: 1.5 } }, { a: { b: null } }], ys: [["a", "b"], ["c", "d"]] };
  expect(render("{{ xs | join(', ', attribute='a.b') }} {{ ys | join(attribute=1) }}", vars)).toBe("1.5, None bd");
  // An item without the attribute joins as "" (jinja2's Undefined), a dict's digit key is no index, a string's is;
  // a part read from Undefined raises.
  const some = { xs: [{ a: 1 }, { b: 2 }, { a: 3 }], ds: [{ "0": "x" }], ss: ["ab", "cd"] };
  expect(render("{{ xs | join('-', attribute='a') }}|{{ ds | join(attribute='0') }}|{{ ss | join(attribute='1') }}", some)).toBe("1--3||bd");
  expect(() => render("{{ xs | join(attribute='a.b') }}", some)).toThrow(/undefined/);
});

describe("the bound on a render's work", () => {
  // Each is cheap to write and would keep jinja2 busy for minutes or exhaust memory; each stops at the bound.
  const hostile: Record<string, string> = {
    "loops nested over range()": "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "a loop over a list made once": "{% set r = range(100000) %}{% for i in r %}{% for j in r %}{% break %}{% endfor %}{% endfor %}",
    "a list searched in a loop": "{% set r = range(100000) %}{% for i in r %}{% if -1 in r %}{% endif %}{% endfor %}",
    "a string doubled": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "a list doubled": "{% set ns = namespace(a=[1]) %}{% for i in range(64) %}{% set ns.a = ns.a + ns.a %}{% endfor %}",
    "a list nested in itself, printed": "{% set ns = namespace(a=['x']) %}{% for i in range(64) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a }}",
    "... through tojson": "{% set ns = namespace(a=['x']) %}{% for i in range(64) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a | tojson }}",
    "... through join": "{% set ns = namespace(a=['x']) %}{% for i in range(64) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a | join(',') }}",
    "a string replaced into itself": "{% set ns = namespace(s='xxxx') %}{% for i in range(30) %}{% set ns.s = ns.s.replace('', ns.s) %}{% endfor %}",
    "... by the filter": "{% set ns = namespace(s='xxxx') %}{% for i in range(30) %}{% set ns.s = ns.s | replace('', ns.s) %}{% endfor %}",
    "a big string joined from a long list of one dict":
      "{% set ns = namespace(s='x', a=[]) %}{% for i in range(18) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{% set ns.a = [{'k': ns.s}] %}" +
      "{% for i in range(18) %}{% set ns.a = ns.a + ns.a %}{% endfor %}{{ ns.a | join(attribute='k') }}",
    "a huge indent": "{{ 'a\nb' | indent(1000000000) }}",
    "a huge tojson indent": "{{ [[1]] | tojson(indent=1000000000) }}",
  };
  for (const [name, source] of Object.entries(hostile)) {
    test(`stops ${name}`, () => {
      expect(() => render(source)).toThrow(RenderBoundExceeded);
    });
  }

  test("evaluates a method's object, a filter's operand and their arguments once where the library takes them over", () => {
    const xs = Array.from({ length: 1000 }, (_, i) => i);
    const cost = (source: string) => {
      const c: RenderCost = { steps: 0, chars: 0, inputChars: 0 };
      // Each raises (the library has no such method or filter of a list): the cost is counted all the same.
      expect(() => new PyTemplate(source).render({ xs }, c)).toThrow();
      return { steps: c.steps, chars: c.chars };
    };
    // Beside a method and a filter the library alone evaluates: the same steps and characters.
    expect(cost("{{ (xs + xs).keys() }}")).toEqual(cost("{{ (xs + xs).foo() }}"));
    expect(cost("{{ (xs + xs).strip('x' ~ 'y') }}")).toEqual(cost("{{ (xs + xs).foo('x' ~ 'y') }}"));
    expect(cost("{{ (xs + xs) | trim }}")).toEqual(cost("{{ (xs + xs) | upper }}"));
  });

  test("counts a template's later renders as its first, whatever ran between", () => {
    // What a node costs is worked out once per template (see FACTS): a render after others counts as a first one.
    const source = "{% for m in messages[::-1] %}{% if m.content is string and m.content[0] == '<' %}{{ m.content[1:] | trim }}" +
      "{% elif m.role == 'user' %}{{ (m.content ~ '!').split('x')[0] }}{% endif %}{% endfor %}{{ messages | length }}{{ messages[0].content[-1] }}";
    const vars = { messages: [{ role: "user", content: "<t>abc" }, { role: "assistant", content: ["x"] }, { role: "user", content: "axd" }] };
    const costOf = (t: PyTemplate, v: Record<string, unknown>) => {
      const c: RenderCost = { steps: 0, chars: 0, inputChars: 0 };
      return { text: t.render(v, c), ...c };
    };
    const first = costOf(new PyTemplate(source), vars);
    const reused = new PyTemplate(source);
    costOf(reused, { messages: [{ role: "assistant", content: "" }] });
    expect(costOf(reused, vars)).toEqual(first);
    expect(costOf(reused, vars)).toEqual(first);
  });

  test("leaves the same constructs alone at a template's sizes", () => {
    expect(render("{% for i in range(3) %}{% for j in range(2) %}{{ i }}{{ j }} {% endfor %}{% endfor %}")).toBe("00 01 10 11 20 21 ");
    expect(render("{{ 'ab'.replace('', '-') }} {{ 'a\nb' | indent(2) }} {{ [[1]] | tojson(indent=1) }}")).toBe("-a-b- a\n  b [\n [\n  1\n ]\n]");
    expect(render("{% set ns = namespace(a=['x']) %}{% for i in range(3) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a | tojson | length }}")).toBe("68");
    // A rare character of a long message replaced by a longer text builds little: counted, not guessed.
    const long = { m: `${"a".repeat(300_000)}Z`, r: "y".repeat(1000) };
    expect(render("{{ m.replace('Z', r) | length }} {{ m | replace('Z', r) | length }}", long)).toBe("301000 301000");
  });
});

describe("== and in, as Python compares", () => {
  test("lists, tuples and dicts by their items, where the library compared identities", () => {
    const vars = { l: ["a"], e: [], d: { a: 1, b: [1, 2] }, pairs: { k: 1 } };
    expect(render("{{ l == ['a'] }} {{ e == [] }} {{ [1, 2] == [1, 2] }} {{ [1] == [2] }} {{ l != ['a'] }} {{ [] != [] }}", vars))
      .toBe("True True True False False False");
    expect(render("{{ d == {'a': 1, 'b': [1, 2]} }} {{ d == {'a': 1} }} {{ d == {'a': 1, 'b': [1, 3]} }}", vars)).toBe("True False False");
    // A dict's pairs are tuples: equal to a tuple, never to a list.
    expect(render("{% for p in pairs.items() %}{{ p == ('k', 1) }} {{ p == ['k', 1] }}{% endfor %} {{ (1, 2) == (1, 2) }}", vars)).toBe("True False True");
  });

  test("scalars by Python's rules, where the library used JavaScript's ==", () => {
    expect(render("{{ '1' == 1 }} {{ '' == 0 }} {{ '' == false }} {{ 1 == true }} {{ 1.0 == 1 }} {{ x == none }} {{ none == none }} {{ x == y }}"))
      .toBe("False False False True True False True True");
    expect(render("{{ '1' != 1 }} {{ [1] == '1' }} {{ 'a' == 'a' }}")).toBe("True False True");
  });

  test("membership in a list compares the same way", () => {
    expect(render("{{ [1] in [[1], [2]] }} {{ ('k', 1) in d.items() | list }} {{ none in [none] }} {{ x in ['a'] }} {{ [3] not in [[1]] }} {{ 'a' in ['a'] }}", { d: { k: 1 } }))
      .toBe("True True True False True True");
  });
});

test("startswith and endswith answer as str's, one string or a tuple, and raise on an undefined object", () => {
  const vars = { s: "abc" };
  expect(render("{{ s.startswith('ab') }} {{ s.startswith('bc') }} {{ s.startswith('') }} {{ s.startswith('abcd') }}", vars)).toBe("True False True False");
  expect(render("{{ s.endswith('bc') }} {{ s.endswith('ab') }} {{ s.endswith('') }} {{ 'x'.endswith('xx') }}", vars)).toBe("True False True False");
  expect(render("{{ s.startswith(('x', 'a')) }} {{ s.endswith(('x', 'y')) }}", vars)).toBe("True False");
  expect(() => render("{{ x.startswith('a') }}")).toThrow(TemplateRaised);
  expect(() => render("{{ d.a.endswith('a') }}", { d: {} })).toThrow(TemplateRaised);
});

test("startswith and endswith take start and end as str's do, in code points, and raise jinja2's TypeErrors", () => {
  // Expected: jinja2 3.1.6's ImmutableSandboxedEnvironment on the same templates and values.
  const vars = { s: "abc", e: "\u{1F600}bc", l: "\uD83D", f: "a\u{1F600}", r: "\uDE00" };
  const cases = [
    "{{ s.startswith('b', 1) }}", "{{ s.startswith('c', 1, 2) }}", "{{ s.startswith('b', 1, 2) }}",
    "{{ s.endswith('b', 0, 2) }}", "{{ s.endswith('c', 0, -1) }}", "{{ s.endswith('bc', -2) }}",
    "{{ s.startswith('', 3) }}", "{{ s.startswith('', 4) }}", "{{ s.endswith('', 4) }}", "{{ s.startswith('a', -10) }}",
    "{{ s.startswith('a', none, 1) }}", "{{ s.startswith('b', true) }}", "{{ s.endswith('c', 1, 100) }}",
    "{{ s.endswith(('z', 'bc'), 1) }}", "{{ s.startswith('abc', 0, 2) }}",
    "{{ e.startswith('\u{1F600}b') }}", "{{ e.startswith('b', 1) }}", "{{ e.endswith('\u{1F600}', 0, 1) }}",
    "{{ e.startswith(l) }}", "{{ s.startswith(('a', 1)) }}", "{{ f.endswith(r) }}", "{{ f.endswith(r, 1) }}",
  ];
  expect(cases.map((c) => render(c, vars))).toEqual([
    "True", "False", "True", "True", "False", "True", "True", "False", "False", "True", "True", "True", "True",
    "True", "False", "True", "True", "True", "False", "True", "False", "False",
  ]);
  for (const raising of [
    "{{ s.startswith(['a']) }}", "{{ s.startswith(1) }}", "{{ s.startswith(none) }}", "{{ s.startswith('a', 1.0) }}",
    "{{ s.startswith('a', start=1) }}", "{{ s.startswith((1, 'a')) }}", "{{ s.startswith() }}", "{{ s.startswith('a', 0, 1, 2) }}",
    "{{ s.startswith(x) }}",
  ]) expect(() => render(raising, vars)).toThrow(TemplateRaised);
});

test("capitalize lowers the rest, as str.capitalize", () => {
  expect(render("{{ 'aB cD' | capitalize }} {{ role | capitalize }} {{ '' | capitalize }}", { role: "USER" })).toBe("Ab cd User ");
});
