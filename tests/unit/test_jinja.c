/* test_jinja.c — the template interpreter: expressions, filters, tests, loops, scoping, whitespace
 * control, Python printing, errors with positions, and the limits that bound runaway templates.
 * The last rows of the differential table are whole templates in the style of Qwen 3 (reverse scan
 * for the last query, <think> split out of content), Llama 3 (tojson(indent=4), single-call guard)
 * and plain ChatML, written for this test.
 *
 * The differential table's expected outputs are what Python jinja2 3.1.6 renders for the same
 * template and variables in the transformers environment (trim_blocks, lstrip_blocks, loopcontrols,
 * the transformers tojson), so each row pins one behaviour to the reference implementation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "text/jinja.h"

typedef struct {
  const char *tpl, *ctx, *want;
} diff_case;

static const diff_case DIFF[] = {
    {"{{ 5 }}|{{ 2.5 }}|{{ 1e-5 }}|{{ 1e16 }}|{{ 1e15 }}|{{ 100.0 }}|{{ -0.0 }}|{{ 0.1 + 0.2 }}",
     "{}", "5|2.5|1e-05|1e+16|1000000000000000.0|100.0|-0.0|0.30000000000000004"},
    {"{{ true }}|{{ False }}|{{ none }}|{{ None }}|{{ 'a' 'b' \"c\" }}", "{}",
     "True|False|None|None|abc"},
    {"{{ [1, 'a', none, true, 1.5, {'k': \"v'\"}] }}|{{ (1,) }}|{{ (1, 2) }}|{{ () }}", "{}",
     "[1, 'a', None, True, 1.5, {'k': \"v'\"}]|(1,)|(1, 2)|()"},
    {"{{ d }}|{{ l }}|{{ f }}|{{ big }}",
     "{\"d\": {\"b\": 1, \"A\": [1, 2.0]}, \"l\": [\"x\", \"it's\", \"say \\\"hi\\\"\"], \"f\": "
     "1234567.125, \"big\""
     ": 12345678901234567890}",
     "{'b': 1, 'A': [1, 2.0]}|['x', \"it's\", 'say \"hi\"']|1234567.125|12345678901234567890"},
    {"{{ 'tab\\there' }}|{{ 'nl\\nx' }}|{{ '\\u00e9\\x41' }}|{{ '\\d' }}|{{ [\"a\\nb\", 'c\\\\d'] "
     "}}",
     "{}", "tab\there|nl\nx|éA|\\d|['a\\nb', 'c\\\\d']"},
    {"{{ 'héllo wörld'|upper }}|{{ 'ÉCOLE'|lower }}|{{ 'héllo'|length }}|{{ 'héllo'[1] }}|{{ "
     "'héllo'[::-1] }}",
     "{}", "HÉLLO WÖRLD|école|5|é|olléh"},
    {"a  {{- 'b' -}}  c\n  {%- if true %} d {% endif -%}  \n e", "{}", "abc d e"},
    {"line1\n    {% if true %}\n    x\n    {% endif %}\nline2\n", "{}", "line1\n    x\nline2"},
    {"{% for i in [1,2] %}\n  {{ i }}\n{% endfor %}\n", "{}", "  1\n  2\n"},
    {"a\n{# comment #}\nb\n  {#- c2 -#}  \nc", "{}", "a\nbc"},
    {"  {%+ if true %}x{% endif +%}\ny", "{}", "  x\ny"},
    {"{{ 1 }}\n{{ 2 }}\n", "{}", "1\n2"},
    {"{% raw %}{{ not evaluated }}{% endraw %}|{%- raw -%}  {% x %}  {%- endraw -%}|", "{}",
     "{{ not evaluated }}|{% x %}|"},
    {"{{ {'a': {'b': 1}} }}", "{}", "{'a': {'b': 1}}"},
    {"{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 / 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 4 / 2 }} "
     "{{ 7.5 // 2 }} {{ -"
     "7.5 % 2 }}",
     "{}", "3 -4 3.5 2 -2 1024 2.0 3.0 0.5"},
    {"{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 'a' ~ 1 ~ none }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ [1] + "
     "[2] }} {{ 'x' + '"
     "y' }}",
     "{}", "7 9 a1None ababab [1, 1] [1, 2] xy"},
    {"{{ 1 < 2 < 3 }} {{ 3 > 2 > 5 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ [1, 2] < "
     "[1, 3] }} {{ none ="
     "= none }}",
     "{}", "True False True True True True True"},
    {"{{ 'b' in 'abc' }} {{ 1 in [1, 2] }} {{ 'k' in d }} {{ 'z' not in d }} {{ not 'k' in d }}",
     "{\"d\": {\"k\": 1}}", "True True True True False"},
    {"{{ 0 or 'x' }} {{ 1 and 'y' }} {{ '' or [] }} {{ none and 1 }} {{ not none }} {{ 'yes' if 0 "
     "else 'no' }} {{ 'x"
     "' if false }}|",
     "{}", "x y [] None True no |"},
    {"{{ -x }} {{ +x }} {{ -2.5 }} {{ - - 3 }}", "{\"x\": 4}", "-4 4 -2.5 3"},
    {"{{ x[0] }} {{ x[-1] }} {{ x[1:] }} {{ x[:-1] }} {{ x[::2] }} {{ x[::-1] }} {{ x[5] }}| {{ "
     "x[1:100] }} {{ x[-10"
     "0:1] }} {{ x[3:1:-1] }}",
     "{\"x\": [1, 2, 3, 4]}", "1 4 [2, 3, 4] [1, 2, 3] [1, 3] [4, 3, 2, 1] | [2, 3, 4] [1] [4, 3]"},
    {"{{ s[1:3] }} {{ s[-2:] }} {{ s[::-1] }} {{ s.0 }} {{ x.1 }}",
     "{\"s\": \"abcdé\", \"x\": [7, 8]}", "bc dé édcba a 8"},
    {"{{ d.a }} {{ d['b'] }} {{ d.missing }}|{{ d['missing'] }}|{{ d.get('a') }} {{ d.get('zz', "
     "'def') }} {{ d.get('"
     "zz') }}",
     "{\"d\": {\"a\": 1, \"b\": 2}}", "1 2 ||1 def None"},
    {"{{ none.x }}|{{ 5.x }}|{{ 'str'.x }}|", "{}", "|||"},
    {"{% if a %}A{% elif b %}B{% else %}C{% endif %}{% if not a and not b %}!{% endif %}",
     "{\"a\": 0, \"b\": 1}", "B"},
    {"{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.length }}/{{ loop.first }}/{{ "
     "loop.last }}/{{ loop"
     ".revindex }}/{{ loop.revindex0 }} {% endfor %}",
     "{\"xs\": [\"a\", \"b\", \"c\"]}",
     "1/0/3/True/False/3/2 2/1/3/False/False/2/1 3/2/3/False/True/1/0 "},
    {"{% for x in xs %}{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }} {% endfor %}|{% for x in [] "
     "%}no{% else %}emp"
     "ty{% endfor %}",
     "{\"xs\": [1, 2, 3]}", "<1>2 1<2>3 2<3> |empty"},
    {"{% for x in xs if x % 2 %}{{ x }}{{ ',' if not loop.last }}{% endfor %}",
     "{\"xs\": [1, 2, 3, 4, 5]}", "1,3,5"},
    {"{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
     "{\"d\": {\"z\": 1, \"a\": 2}}", "z=1;a=2;za"},
    {"{% for a, b in [[1, 2], (3, 4)] %}{{ a + b }} {% endfor %}", "{}", "3 7 "},
    {"{% for x in 'hé' %}[{{ x }}]{% endfor %}", "{}", "[h][é]"},
    {"{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% "
     "endif %}{{ x }}{%"
     " endfor %}",
     "{}", "0134"},
    {"{% for i in range(2) %}{% for j in range(2) %}{{ loop.index }}{{ i }}{{ j }} {% endfor %}{{ "
     "loop.index }}|{% e"
     "ndfor %}",
     "{}", "100 201 1|110 211 2|"},
    {"{{ range(5)|list }} {{ range(1, 4)|list }} {{ range(10, 0, -3)|list }} {{ range(0)|list }}",
     "{}", "[0, 1, 2, 3, 4] [1, 2, 3] [10, 7, 4, 1] []"},
    {"{% set x = 1 %}{% for i in [1,2] %}{{ x }}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}",
     "{}", "12121"},
    {"{% set ns = namespace(n=0, s='') %}{% for i in [1,2,3] %}{% set ns.n = ns.n + i %}{% set "
     "ns.s = ns.s ~ i %}{% "
     "endfor %}{{ ns.n }} {{ ns.s }}",
     "{}", "6 123"},
    {"{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = (3, 4) %}{% set c, d = t %}{{ c }}{{ d }}",
     "{}", "1234"},
    {"{% set cap %}  Hello {{ name }}  {% endset %}[{{ cap }}]{% set up | upper %}abc{% endset "
     "%}{{ up }}",
     "{\"name\": \"Bo\"}", "[  Hello Bo  ]ABC"},
    {"{% if true %}{% set y = 5 %}{% endif %}{{ y }}", "{}", "5"},
    {"{% set x = 'outer' %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 'later' %}{{ m() }}",
     "{}", "later"},
    {"{% macro m(a, b=2, c='x') %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }} {{ m(1, 3) }} {{ "
     "m(c='z', a=0) }}",
     "{}", "1-2-x 1-3-x 0-2-z"},
    {"{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro "
     "%}{{ fact(6) }}",
     "{}", "720"},
    {"{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') "
     "%}bold {{ 1 + 1 }}{%"
     " endcall %}",
     "{}", "<b>bold 2</b>"},
    {"{% macro row(x) %}[{{ caller(x * 2) }}]{% endmacro %}{% call(v) row(4) %}v={{ v }}{% endcall "
     "%}",
     "{}", "[v=8]"},
    {"{% filter upper %}shout {{ 'it' }}{% endfilter %}", "{}", "SHOUT IT"},
    {"[{{ '  a b \\n'|trim }}] [{{ 'xxaxx'|trim('x') }}] {{ 'abc'|upper }} {{ 'ABC'|lower }} {{ "
     "'hello world'|capita"
     "lize }} {{ 'hello wORLD-x(y'|title }}",
     "{}", "[a b] [a] ABC abc Hello world Hello World-X(Y"},
    {"{{ [3, 1, 2]|length }} {{ 'abc'|count }} {{ {'a': 1}|length }} {{ undefined_var|length }}",
     "{}", "3 3 1 0"},
    {"{{ d|dictsort }} {{ d|dictsort(true) }} {{ d|dictsort(by='value') }} {{ "
     "d|dictsort(reverse=true) }}",
     "{\"d\": {\"b\": 2, \"A\": 3, \"c\": 1, \"Zeta\": 0}}",
     "[('A', 3), ('b', 2), ('c', 1), ('Zeta', 0)] [('A', 3), ('Zeta', 0), ('b', 2), ('c', 1)] "
     "[('Zeta', 0), ('c', 1)"
     ", ('b', 2), ('A', 3)] [('Zeta', 0), ('c', 1), ('b', 2), ('A', 3)]"},
    {"{{ x|tojson }} {{ d|tojson }} {{ d|tojson(indent=2) }} {{ 'é\"\\n'|tojson }} {{ [1.0, 1e-07, "
     "none, true]|tojso"
     "n }} {{ d|tojson(sort_keys=true) }}",
     "{\"x\": [1, \"a\"], \"d\": {\"b\": 1, \"a\": [1, {\"c\": null}]}}",
     "[1, \"a\"] {\"b\": 1, \"a\": [1, {\"c\": null}]} {\n  \"b\": 1,\n"
     "  \"a\": [\n    1,\n    {\n      \"c\": null\n    }\n  ]\n} \"é\\\"\\n\" [1.0, 1e-07, null, "
     "true] {\"a\": [1, "
     "{\"c\": null}], \"b\": 1}"},
    {"{{ {'a': []}|tojson(indent=2) }}|{{ [{}]|tojson(separators=(',', ':')) }}|{{ "
     "'é'|tojson(ensure_ascii=true) }}",
     "{}", "{\n  \"a\": []\n}|[{}]|\"\\u00e9\""},
    {"{{ d|items|list }} {{ d.items()|list }} {{ d.keys()|list }} {{ d.values()|list }}",
     "{\"d\": {\"x\": 1, \"y\": [2]}}",
     "[('x', 1), ('y', [2])] [('x', 1), ('y', [2])] ['x', 'y'] [1, [2]]"},
    {"{{ u|default('dflt') }} {{ ''|default('e') }} {{ ''|default('e', true) }} {{ "
     "none|default('n') }} {{ none|d('n"
     "', true) }} {{ 0|default(5, boolean=true) }}",
     "{}", "dflt  e None n 5"},
    {"{{ [1, 2, 3]|join }} {{ ['a', 'b']|join(', ') }} {{ users|join('/', attribute='name') }}",
     "{\"users\": [{\"name\": \"a\"}, {\"name\": \"b\"}]}", "123 a, b a/b"},
    {"{{ 'a-b-c'|replace('-', '+') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'ab'|replace('', '.') }}",
     "{}", "a+b+c bba .a.b."},
    {"{{ 5|string ~ 'x' }} {{ none|string }} {{ [1]|string }} {{ '42'|int + 1 }} {{ '0x1A'|int(0, "
     "16) }} {{ 'x'|int "
     "}} {{ 'x'|int(7) }} {{ 3.99|int }} {{ ' 12 '|int }} {{ '1.5'|float }} {{ 2|float }} {{ "
     "'q'|float }}",
     "{}", "5x None [1] 43 26 0 7 3 12 1.5 2.0 0.0"},
    {"{{ xs|first }} {{ xs|last }} {{ 'abc'|first }} {{ 'abc'|last }} {{ []|first }}|{{ xs|list }} "
     "{{ 'ab'|list }} {"
     "{ d|list }}",
     "{\"xs\": [4, 5, 6], \"d\": {\"k\": 1, \"j\": 2}}",
     "4 6 a c |[4, 5, 6] ['a', 'b'] ['k', 'j']"},
    {"{{ xs|map(attribute='a')|list }} {{ ['a', 'b']|map('upper')|list }} {{ "
     "xs|map(attribute='zz', default='-')|lis"
     "t }} {{ ['1', '2']|map('int')|sum }}",
     "{\"xs\": [{\"a\": 1}, {\"a\": 2}]}", "[1, 2] ['A', 'B'] ['-', '-'] 3"},
    {"{{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3, 4]|reject('odd')|list }} {{ [0, 1, '', "
     "'a']|select|list }} "
     "{{ [1, 5, 9]|select('gt', 4)|list }}",
     "{}", "[1, 3] [2, 4] [1, 'a'] [5, 9]"},
    {"{{ xs|selectattr('a')|list }} {{ xs|rejectattr('a')|list }} {{ xs|selectattr('a', 'equalto', "
     "2)|list }} {{ xs|"
     "selectattr('b', 'defined')|list }}",
     "{\"xs\": [{\"a\": 0}, {\"a\": 2, \"b\": 1}, {\"a\": 3}]}",
     "[{'a': 2, 'b': 1}, {'a': 3}] [{'a': 0}] [{'a': 2, 'b': 1}] [{'a': 2, 'b': 1}]"},
    {"{{ '<b>&\\'\"'|e }} {{ '<i>'|escape }} {{ '<x>'|safe }}", "{}",
     "&lt;b&gt;&amp;&#39;&#34; &lt;i&gt; <x>"},
    {"{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, "
     "blank=true) }}|{{ 'x\\n'|ind"
     "ent('> ') }}|",
     "{}", "a\n    b\n\n    c|  a\n  b|a\n  \n  b|x\n|"},
    {"{{ 2.5|round }} {{ 3.5|round }} {{ 2.567|round(2) }} {{ 2.561|round(2, 'floor') }} {{ "
     "2.561|round(1, 'ceil') }"
     "} {{ 7|round }} {{ -2.5|abs }} {{ -3|abs }}",
     "{}", "2.0 4.0 2.57 2.56 2.6 7 2.5 3"},
    {"{{ [3, 1, 2]|sort }} {{ ['b', 'A', 'c']|sort }} {{ ['b', 'A', 'c']|sort(case_sensitive=true) "
     "}} {{ [3, 1, 2]|s"
     "ort(reverse=true) }} {{ xs|sort(attribute='n')|map(attribute='n')|list }}",
     "{\"xs\": [{\"n\": 2}, {\"n\": 1}]}",
     "[1, 2, 3] ['A', 'b', 'c'] ['A', 'b', 'c'] [3, 2, 1] [1, 2]"},
    {"{{ [1, 2, 1, 'A', 'a']|unique|list }} {{ [3, 1, 2]|min }} {{ [3, 1, 2]|max }} {{ ['b', "
     "'A']|min }} {{ [1, 2, 3"
     "]|sum }} {{ [1.5, 2]|sum }} {{ xs|sum(attribute='n') }}",
     "{\"xs\": [{\"n\": 2}, {\"n\": 1}]}", "[1, 2, 'A'] 1 3 A 6 3.5 3"},
    {"{{ 'abc'|reverse }} {{ [1, 2]|reverse|list }} {{ 'one two  three'|wordcount }} {{ "
     "'abc'|center(9) }}| {{ 'hell"
     "o world foo bar'|truncate(9) }} {{ 'hello world'|truncate(5, true) }} {{ 'short'|truncate(9) "
     "}}",
     "{}", "cba [2, 1] 3    abc   | hello... he... short"},
    {"{{ '%s-%d-%05.2f-%x-%r-%%' % ('a', 3, 3.14159, 255, 'q') }} {{ '%s' % 5 }} {{ '%(a)s+%(b)d' "
     "% {'a': 'x', 'b': "
     "2} }} {{ '%-4s|%4s' % ('a', 'b') }} {{ '%s and %s'|format('x', 'y') }}",
     "{}", "a-3-03.14-ff-'q'-% 5 x+2 a   |   b x and y"},
    {"{{ {'a': 1}|attr('a') }}|{{ x|attr('y') }}|", "{\"x\": {\"y\": 2}}", "||"},
    {"{{ u is defined }} {{ u is undefined }} {{ none is none }} {{ 1 is none }} {{ 's' is string "
     "}} {{ 1 is string "
     "}} {{ d is mapping }} {{ [] is mapping }}",
     "{\"d\": {}}", "False True True False True False True False"},
    {"{{ 1 is number }} {{ 1.5 is number }} {{ true is number }} {{ 's' is number }} {{ 1 is "
     "integer }} {{ 1.0 is in"
     "teger }} {{ true is integer }} {{ 1.0 is float }} {{ true is boolean }} {{ 1 is boolean }}",
     "{}", "True True True False True False False True True False"},
    {"{{ [] is iterable }} {{ 's' is iterable }} {{ d is iterable }} {{ 1 is iterable }} {{ [] is "
     "sequence }} {{ 's'"
     " is sequence }} {{ d is sequence }} {{ 1 is sequence }} {{ u is sequence }}",
     "{\"d\": {}}", "True True True False True True True False True"},
    {"{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} {{ 3 is odd }} {{ 4 "
     "is even }} {{ 9 i"
     "s divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 2 is in [1, 2] }} {{ 'a' is in 'cat' }}",
     "{}", "True False True False True True True False True True"},
    {"{{ 1 is eq 1 }} {{ 1 is ne 2 }} {{ 1 is lt 2 }} {{ 3 is ge 3 }} {{ 'abc' is lower }} {{ "
     "'ABC' is upper }} {{ '"
     "aB' is lower }} {{ m is callable }} {{ 1 is callable }} {{ none is sameas none }} {{ x is "
     "not none and x > 1 }"
     "}",
     "{\"x\": 2}", "True True True True True True False True False True True"},
    {"{{ '  x  '.strip() }}|{{ 'xxyxx'.strip('x') }}|{{ '  x  '.lstrip() }}|{{ '  x  '.rstrip() "
     "}}|{{ '\\n\\nx'.lstr"
     "ip('\\n') }}",
     "{}", "x|y|x  |  x|x"},
    {"{{ 'a b  c '.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} {{ "
     "'a,b,c'.rsplit(',', 1) }} {{ "
     "'  a b '.rsplit() }} {{ 'x'.split('y') }} {{ 'a</think>b'.split('</think>')[-1] }}",
     "{}", "['a', 'b', 'c'] ['a', 'b', '', 'c'] ['a', 'b,c'] ['a,b', 'c'] ['a', 'b'] ['x'] b"},
    {"{{ 'abc'.startswith('ab') }} {{ 'abc'.startswith(('x', 'a')) }} {{ 'abc'.endswith('bc') }} "
     "{{ 'abc'.endswith('"
     "x') }} {{ 'ab'.upper() }} {{ 'AB'.lower() }} {{ 'a b'.title() }} {{ 'ab'.capitalize() }}",
     "{}", "True True True False AB ab A B Ab"},
    {"{{ 'hello'.replace('l', 'L') }} {{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ "
     "'hello'.find('z') }} {{ 'h"
     "ello'.count('l') }} {{ '-'.join(['a', 'b']) }} {{ '{} {}-{x}'.format(1, 'two', x=3) }}",
     "{}", "heLLo 2 3 -1 2 a-b 1 two-3"},
    {"{{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ 'a1'.isalnum() }} {{ ' '.isspace() }} {{ "
     "''.isdigit() }} {{ 'ab'."
     "islower() }} {{ 'line1\\nline2\\r\\nline3'.splitlines() }} {{ "
     "'prefix_x'.removeprefix('prefix_') }}",
     "{}", "True True True True False True ['line1', 'line2', 'line3'] x"},
    {"{% for x in xs %}{{ loop.cycle('odd', 'even') }} {% endfor %}", "{\"xs\": [1, 2, 3]}",
     "odd even odd "},
    {"{{ {'a': 1, 'b': [2]} }} {{ dict(a=1, b=2) }} {{ namespace(a=1).a }} {{ {1: 'x', 1.5: 'y', "
     "none: 'z'} }}",
     "{}", "{'a': 1, 'b': [2]} {'a': 1, 'b': 2} 1 {1: 'x', 1.5: 'y', None: 'z'}"},
    {"{% set d = {'k': 'v'} %}{{ d.k }}{{ d['k'] }}{% for k, v in d|dictsort %}{{ k }}{{ v }}{% "
     "endfor %}",
     "{}", "vvkv"},
    {"{{ messages[0]['content'] | trim + ' ' }}|{{ 'a' + 'b' | upper }}|{{ captured | trim | "
     "length > 0 }}",
     "{\"messages\": [{\"content\": \" hi \"}], \"captured\": \"  \"}", "hi |aB|False"},
    {"{{ 'x' if a is defined and a else 'y' }} {{ (a or b) | default('d') }} {{ [a, b] | select | "
     "list }}",
     "{\"a\": 0, \"b\": \"B\"}", "y B ['B']"},
    {"{%- for m in messages[::-1] %}{{ m.role }}{% endfor -%}|{{ "
     "messages|map(attribute='role')|join(',') }}",
     "{\"messages\": [{\"role\": \"user\"}, {\"role\": \"assistant\"}]}",
     "assistantuser|user,assistant"},
    {"{{ raise_exception is defined }} {{ namespace is callable }}", "{}", "True True"},
    {"{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
     "{%- for message in messages[::-1] %}\n    {%- set index = (messages|length - 1) - "
     "loop.index0 %}\n"
     "    {%- if ns.multi_step_tool and message.role == \"user\" and message.content is string and "
     "not(message.conte"
     "nt.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}\n"
     "        {%- set ns.multi_step_tool = false %}\n        {%- set ns.last_query_index = index "
     "%}\n"
     "    {%- endif %}\n{%- endfor %}\n{%- for message in messages %}\n"
     "    {%- set content = message.content if message.content is string else '' %}\n"
     "    {%- if message.role == \"assistant\" %}\n        {%- set reasoning_content = '' %}\n"
     "        {%- if message.reasoning_content is string %}\n            {%- set reasoning_content "
     "= message.reasoni"
     "ng_content %}\n        {%- elif '</think>' in content %}\n            {%- set "
     "reasoning_content = content.spli"
     "t('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}\n"
     "            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n"
     "        {%- endif %}\n        {%- if loop.index0 > ns.last_query_index %}\n"
     "            {{- '<|im_start|>' + message.role + '\\n<think>\\n' + "
     "reasoning_content.strip('\\n') + '\\n</think"
     ">\\n\\n' + content.lstrip('\\n') }}\n        {%- else %}\n            {{- '<|im_start|>' + "
     "message.role + '\\n"
     "' + content }}\n        {%- endif %}\n        {%- if message.tool_calls %}\n"
     "            {%- for tool_call in message.tool_calls %}\n                {%- if (loop.first "
     "and content) or (no"
     "t loop.first) %}{{- '\\n' }}{%- endif %}\n                {%- if tool_call.function %}{%- "
     "set tool_call = tool"
     "_call.function %}{%- endif %}\n                {{- '<tool_call>\\n{\"name\": \"' }}{{- "
     "tool_call.name }}{{- '\""
     ", \"arguments\": ' }}\n                {%- if tool_call.arguments is string %}{{- "
     "tool_call.arguments }}{%- el"
     "se %}{{- tool_call.arguments | tojson }}{%- endif %}\n                {{- '}\\n</tool_call>' "
     "}}\n"
     "            {%- endfor %}\n        {%- endif %}\n        {{- '<|im_end|>\\n' }}\n"
     "    {%- elif message.role == \"tool\" %}\n        {%- if loop.first or (messages[loop.index0 "
     "- 1].role != \"to"
     "ol\") %}{{- '<|im_start|>user' }}{%- endif %}\n        {{- '\\n<tool_response>\\n' }}{{- "
     "content }}{{- '\\n</t"
     "ool_response>' }}\n        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") "
     "%}{{- '<|im_end|>\\"
     "n' }}{%- endif %}\n    {%- else %}\n        {{- '<|im_start|>' + message.role + '\\n' + "
     "content + '<|im_end|>'"
     " + '\\n' }}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}{{- "
     "'<|im_start|>assistant\\n' }}"
     "{%- if enable_thinking is defined and enable_thinking is false %}{{- "
     "'<think>\\n\\n</think>\\n\\n' }}{%- endif"
     " %}{%- endif %}",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", "
     "\"content\": \"<think>\\n"
     "plan\\n</think>\\n\\nHello\"}, {\"role\": \"user\", \"content\": \"Weather?\"}, {\"role\": "
     "\"assistant\", \"co"
     "ntent\": \"\", \"reasoning_content\": \"need tool\", \"tool_calls\": [{\"type\": "
     "\"function\", \"function\": {"
     "\"name\": \"w\", \"arguments\": {\"c\": \"P\", \"n\": 2.0}}}]}, {\"role\": \"tool\", "
     "\"content\": \"18C\"}, {\""
     "role\": \"tool\", \"content\": \"dry\"}], \"add_generation_prompt\": true, "
     "\"enable_thinking\": false}",
     "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"
     "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n"
     "<think>\nneed tool\n</think>\n\n<tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": \"P\", "
     "\"n\": 2.0}}\n"
     "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n18C\n"
     "</tool_response>\n<tool_response>\ndry\n</tool_response><|im_end|>\n"
     "<|im_start|>assistant\n<think>\n\n</think>\n\n"},
    {"{{- bos_token }}\n{%- if messages[0]['role'] == 'system' %}\n"
     "    {%- set system_message = messages[0]['content']|trim %}\n"
     "    {%- set messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = \"\" %}\n"
     "{%- endif %}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
     "{%- if tools is not none %}\n    {{- \"Environment: ipython\\n\" }}\n"
     "{%- endif %}\n{{- \"Cutting Knowledge Date: December 2023\\n\\n\" }}\n"
     "{%- if tools is not none %}\n    {%- for t in tools %}\n        {{- t | tojson(indent=4) }}\n"
     "        {{- \"\\n\\n\" }}\n    {%- endfor %}\n{%- endif %}\n{{- system_message }}\n"
     "{{- \"<|eot_id|>\" }}\n{%- for message in messages %}\n    {%- if not (message.role == "
     "'ipython' or message.ro"
     "le == 'tool' or 'tool_calls' in message) %}\n        {{- '<|start_header_id|>' + "
     "message['role'] + '<|end_head"
     "er_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n"
     "    {%- elif 'tool_calls' in message %}\n        {%- if not message.tool_calls|length == 1 "
     "%}\n"
     "            {{- raise_exception(\"This model only supports single tool-calls at once!\") }}\n"
     "        {%- endif %}\n        {%- set tool_call = message.tool_calls[0].function %}\n"
     "        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
     "        {{- '{\"name\": \"' + tool_call.name + '\", ' }}\n        {{- '\"parameters\": ' }}\n"
     "        {{- tool_call.arguments | tojson }}\n        {{- \"}\" }}\n"
     "        {{- \"<|eot_id|>\" }}\n    {%- elif message.role == \"tool\" or message.role == "
     "\"ipython\" %}\n"
     "        {{- \"<|start_header_id|>ipython<|end_header_id|>\\n\\n\" }}\n"
     "        {%- if message.content is mapping or message.content is iterable %}\n"
     "            {{- message.content | tojson }}\n        {%- else %}\n"
     "            {{- message.content }}\n        {%- endif %}\n        {{- \"<|eot_id|>\" }}\n"
     "    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n"
     "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
     "{%- endif %}",
     "{\"bos_token\": \"<|begin_of_text|>\", \"messages\": [{\"role\": \"system\", \"content\": \" "
     "Be kind. \"}, {\""
     "role\": \"user\", \"content\": \" q \"}, {\"role\": \"assistant\", \"tool_calls\": "
     "[{\"function\": {\"name\": "
     "\"f\", \"arguments\": {\"x\": [1, {\"y\": null}]}}}]}, {\"role\": \"tool\", \"content\": "
     "{\"ok\": true}}], \"t"
     "ools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": "
     "\"object\", \"pro"
     "perties\": {\"x\": {\"type\": \"array\"}}}}}], \"add_generation_prompt\": true}",
     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n"
     "\nEnvironment: ipython\nCutting Knowledge Date: December 2023\n"
     "\n{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"f\",\n"
     "        \"parameters\": {\n            \"type\": \"object\",\n"
     "            \"properties\": {\n                \"x\": {\n                    \"type\": "
     "\"array\"\n"
     "                }\n            }\n        }\n    }\n}\n\nBe "
     "kind.<|eot_id|><|start_header_id|>user<|end_header"
     "_id|>\n\nq<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
     "\n{\"name\": \"f\", \"parameters\": {\"x\": [1, {\"y\": "
     "null}]}}<|eot_id|><|start_header_id|>ipython<|end_head"
     "er_id|>\n\n{\"ok\": true}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n"
     "\n"},
    {"{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
     "'<|im_start|>system\n"
     "You are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + "
     "'\n"
     "' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
     "'<|im_start|>assist"
     "ant\n' }}{% endif %}",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"hello\"}, {\"role\": \"assistant\", "
     "\"content\": \"hi\"}],"
     " \"add_generation_prompt\": true}",
     "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
     "hello<|im_end|>\n<|im_start|>assistant\nhi<|im_end|>\n<|im_start|>assistant\n"},
    {"{{ strftime_now('%Y') | length }} {{ strftime_now('') }}|", "{}", "4 |"},
};

/* Renders src with the JSON object ctx; returns the status, *out malloc'd on success. */
static lm_status render_lim(const char *src, const char *ctx, const lm_jinja_limits *lim,
                            char **out) {
  lm_jinja_template *t = NULL;
  lm_jarena *a = NULL;
  lm_jv vars = lm_jv_undef();
  *out = NULL;
  lm_status s = lm_jinja_compile(src, strlen(src), NULL, &t);
  if (s == LM_OK) s = lm_jarena_create(lim ? lim->max_memory : 0, &a);
  if (s == LM_OK && ctx) s = lm_jv_parse_json(a, ctx, strlen(ctx), &vars);
  if (s == LM_OK) s = lm_jinja_render(t, a, vars, lim, out, NULL);
  lm_jarena_free(a);
  lm_jinja_free(t);
  return s;
}

static lm_status render(const char *src, const char *ctx, char **out) {
  return render_lim(src, ctx, NULL, out);
}

static void t_differential(void **state) {
  (void)state;
  size_t n = sizeof DIFF / sizeof *DIFF, ok = 0;
  for (size_t i = 0; i < n; i++) {
    char *out;
    lm_status s = render(DIFF[i].tpl, DIFF[i].ctx, &out);
    if (s != LM_OK) {
      print_message("case %zu: %s\n  template: %s\n", i, lm_errmsg(), DIFF[i].tpl);
      continue;
    }
    if (strcmp(out, DIFF[i].want) == 0)
      ok++;
    else
      print_message("case %zu:\n  template: %s\n  got:  %s\n  want: %s\n", i, DIFF[i].tpl, out,
                    DIFF[i].want);
    free(out);
  }
  print_message("jinja differential: %zu/%zu match Python jinja2\n", ok, n);
  assert_int_equal(ok, n);
}

static void t_float_repr(void **state) {
  (void)state;
  static const struct {
    double v;
    const char *want;
  } rows[] = {
      {0.1, "0.1"},
      {1e-05, "1e-05"},
      {0.0001, "0.0001"},
      {0.0001234, "0.0001234"},
      {1.2345678901234568e+17, "1.2345678901234568e+17"},
      {1e+16, "1e+16"},
      {1000000000000000.0, "1000000000000000.0"},
      {5e-324, "5e-324"},
      {1.7976931348623157e+308, "1.7976931348623157e+308"},
      {2.5, "2.5"},
      {-0.0, "-0.0"},
      {100.0, "100.0"},
      {0.3, "0.3"},
      {1.0 / 3.0, "0.3333333333333333"},
      {9007199254740992.0, "9007199254740992.0"},
      {1e+22, "1e+22"},
      {1.5e-10, "1.5e-10"},
      {-1250.5, "-1250.5"},
      {1e-07, "1e-07"},
      {12345.678, "12345.678"},
      {0.1 + 0.2, "0.30000000000000004"},
      {INFINITY, "inf"},
      {-INFINITY, "-inf"},
      {NAN, "nan"},
  };
  for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
    char buf[32];
    lm_py_float_repr(rows[i].v, buf);
    assert_string_equal(buf, rows[i].want);
  }
}

static void t_whitespace_options(void **state) {
  (void)state;
  /* without trim_blocks/lstrip_blocks the newlines and indentation around tags stay */
  const char *src = "a\n  {% if true %}\n  x\n  {% endif %}\nb\n";
  lm_jinja_options plain = {0, 0};
  lm_jinja_template *t;
  lm_jarena *a;
  char *out;
  assert_int_equal(lm_jinja_compile(src, strlen(src), &plain, &t), LM_OK);
  assert_int_equal(lm_jarena_create(0, &a), LM_OK);
  assert_int_equal(lm_jinja_render(t, a, lm_jv_undef(), NULL, &out, NULL), LM_OK);
  assert_string_equal(out, "a\n  \n  x\n  \nb");
  free(out);
  lm_jinja_free(t);
  assert_int_equal(render(src, NULL, &out), LM_OK);
  assert_string_equal(out, "a\n  x\nb");
  free(out);
  /* \r\n line ends read as \n, as jinja2's splitlines() does */
  assert_int_equal(render("a\r\n{% if 1 %}\r\nb\r\n{% endif %}\r\n", NULL, &out), LM_OK);
  assert_string_equal(out, "a\nb\n");
  free(out);
  lm_jarena_free(a);
}

typedef struct {
  const char *tpl;
  lm_status status;
  const char *msg; /* substring of lm_errmsg() */
} bad_case;

static void t_errors(void **state) {
  (void)state;
  static const bad_case rows[] = {
      {"{{ 1 + }}", LM_ERR_CORRUPT, "line 1 col 8"},
      {"{% if x %}never closed", LM_ERR_CORRUPT, "expected '{% endif %}'"},
      {"{% for x in y %}", LM_ERR_CORRUPT, "expected '{% endfor %}'"},
      {"{% endfor %}", LM_ERR_CORRUPT, "unknown tag 'endfor'"},
      {"{% frobnicate %}", LM_ERR_CORRUPT, "unknown tag 'frobnicate'"},
      {"{{ }}", LM_ERR_CORRUPT, "expected an expression"},
      {"{% set %}", LM_ERR_CORRUPT, "expected a name"},
      {"{{ 'open }}", LM_ERR_CORRUPT, "unterminated string literal"},
      {"{{ x ", LM_ERR_CORRUPT, "unclosed '{{'"},
      {"{# no end", LM_ERR_CORRUPT, "unclosed comment"},
      {"{{ (1 }}", LM_ERR_CORRUPT, "line 1"},
      {"{{ 1 ) }}", LM_ERR_CORRUPT, "unbalanced bracket"},
      {"{{ 'a' @ 1 }}", LM_ERR_CORRUPT, "unexpected character"},
      {"{{ '\\xZZ' }}", LM_ERR_CORRUPT, "bad escape"},
      {"{% raw %}never ends", LM_ERR_CORRUPT, "endraw"},
      {"{% macro m(a=1, b) %}{% endmacro %}", LM_ERR_CORRUPT, "without a default"},
      {"{{ f(a=1, 2) }}", LM_ERR_CORRUPT, "positional argument after keyword"},
      {"{{ f(*xs) }}", LM_ERR_CORRUPT, "not supported"},
      {"{% for x in xs recursive %}{% endfor %}", LM_ERR_CORRUPT, "recursive"},
      {"{% if false %}{{ x | nosuchfilter }}{% endif %}", LM_ERR_UNSUPPORTED,
       "unknown filter 'nosuchfilter'"},
      {"{{ x is nosuchtest }}", LM_ERR_UNSUPPORTED, "unknown test 'nosuchtest'"},
      {"{% include 'other.jinja' %}", LM_ERR_UNSUPPORTED, "tag 'include' is not supported"},
      {"{% extends 'base' %}", LM_ERR_UNSUPPORTED, "not supported"},
      {"\n\n  {{ raise_exception('boom: ' ~ 42) }}", LM_ERR_INVALID,
       "line 3 col 6: raise_exception: boom: 42"},
      {"{{ undefined_thing.x }}", LM_ERR_INVALID, "'undefined_thing' is undefined"},
      {"{{ undefined_thing['x'] }}", LM_ERR_INVALID, "is undefined"},
      {"{{ undefined_thing() }}", LM_ERR_INVALID, "is undefined"},
      {"{{ 'a' + 1 }}", LM_ERR_INVALID, "unsupported operand type(s) for +: 'str' and 'int'"},
      {"{{ 'a' + nope }}", LM_ERR_INVALID, "'nope' is undefined"},
      {"{{ 1 / 0 }}", LM_ERR_INVALID, "division by zero"},
      {"{{ 1 // 0 }}", LM_ERR_INVALID, "division or modulo by zero"},
      {"{{ 9223372036854775807 + 1 }}", LM_ERR_UNSUPPORTED, "integer overflow"},
      {"{{ 1 < 'a' }}", LM_ERR_INVALID, "'<' not supported"},
      {"{{ none|length }}", LM_ERR_INVALID, "has no len()"},
      {"{{ 5|dictsort }}", LM_ERR_INVALID, "not a mapping"},
      {"{% for a, b in [1] %}{% endfor %}", LM_ERR_INVALID, "not iterable"},
      {"{% for a, b in [[1, 2, 3]] %}{% endfor %}", LM_ERR_INVALID, "cannot unpack"},
      {"{% for x in 5 %}{% endfor %}", LM_ERR_INVALID, "'int' object is not iterable"},
      {"{% set x = 1 %}{% set x.y = 2 %}", LM_ERR_INVALID, "non-namespace"},
      {"{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", LM_ERR_INVALID, "takes not more than 1"},
      {"{% macro m(a) %}{% endmacro %}{{ m(b=2) }}", LM_ERR_INVALID, "no keyword argument 'b'"},
      {"{{ [1][::0] }}", LM_ERR_INVALID, "slice step cannot be zero"},
      {"{{ 'x'.nosuchmethod() }}", LM_ERR_INVALID, "has no attribute 'nosuchmethod'"},
      {"{{ 5() }}", LM_ERR_INVALID, "not callable"},
      {"{{ '%d' % 'x' }}", LM_ERR_INVALID, "a number is required"},
      {"{{ '%s %s' % (1,) }}", LM_ERR_INVALID, "not enough arguments"},
      {"{{ 'a'.split('') }}", LM_ERR_INVALID, "empty separator"},
      {"{{ {'a': 1}.get() }}", LM_ERR_INVALID, "expected at least 1 argument"},
      {"{{ range(1, 2, 0) }}", LM_ERR_INVALID, "must not be zero"},
      {"{{ x|tojson }}", LM_ERR_INVALID, "not JSON serializable"},
      {"{{ namespace(5) }}", LM_ERR_INVALID, "must be a mapping"},
      {"{{ '{}{}'.format(1) }}", LM_ERR_INVALID, "missing argument"},
  };
  for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
    char *out = NULL;
    lm_status s = render(rows[i].tpl, NULL, &out);
    if (s != rows[i].status || !strstr(lm_errmsg(), rows[i].msg))
      print_message("row %zu: %s -> %s \"%s\"\n", i, rows[i].tpl, lm_status_name(s), lm_errmsg());
    assert_int_equal(s, rows[i].status);
    assert_non_null(strstr(lm_errmsg(), rows[i].msg));
    assert_null(out);
  }
}

static void t_limits(void **state) {
  (void)state;
  char *out;
  lm_jinja_limits lim = lm_jinja_limits_default();
  lim.max_steps = 10000;
  assert_int_equal(
      render_lim("{% for i in range(100) %}{% for j in range(1000) %}{% endfor %}{% endfor %}",
                 NULL, &lim, &out),
      LM_ERR_INVALID);
  assert_non_null(strstr(lm_errmsg(), "steps"));
  lim = lm_jinja_limits_default();
  lim.max_depth = 50;
  assert_int_equal(
      render_lim("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, &lim, &out),
      LM_ERR_INVALID);
  assert_non_null(strstr(lm_errmsg(), "nested deeper than 50"));
  lim = lm_jinja_limits_default();
  lim.max_output = 1000;
  assert_int_equal(render_lim("{% for i in range(1000) %}0123456789{% endfor %}", NULL, &lim, &out),
                   LM_ERR_INVALID);
  assert_non_null(strstr(lm_errmsg(), "output larger than the limit"));
  assert_int_equal(render_lim("{{ 'x' * 100000 }}", NULL, &lim, &out), LM_ERR_INVALID);
  lim = lm_jinja_limits_default();
  lim.max_memory = 4u << 20;
  assert_int_equal(render_lim("{% set ns = namespace(s='xy') %}{% for i in range(40) %}{% set ns.s "
                              "= ns.s ~ ns.s %}{% endfor %}",
                              NULL, &lim, &out),
                   LM_ERR_NOMEM);
  assert_non_null(strstr(lm_errmsg(), "memory limit"));
  assert_int_equal(render("{{ range(1000000000000)|length }}", NULL, &out), LM_ERR_INVALID);
  /* the default limits leave ordinary work alone */
  assert_int_equal(render("{% for i in range(20000) %}{% endfor %}ok", NULL, &out), LM_OK);
  assert_string_equal(out, "ok");
  free(out);
  /* deep nesting is refused by the parser before it can exhaust the stack */
  char deep[2100];
  size_t k = 0;
  k += (size_t)sprintf(deep, "{{ ");
  for (int i = 0; i < 1000; i++)
    deep[k++] = '(';
  deep[k++] = '1';
  for (int i = 0; i < 1000; i++)
    deep[k++] = ')';
  strcpy(deep + k, " }}");
  assert_int_equal(render(deep, NULL, &out), LM_ERR_CORRUPT);
  assert_non_null(strstr(lm_errmsg(), "nested too deeply"));
  char blocks[8000];
  k = 0;
  for (int i = 0; i < 600; i++)
    k += (size_t)sprintf(blocks + k, "{%% if 1 %%}");
  assert_int_equal(render(blocks, NULL, &out), LM_ERR_CORRUPT);
}

/* Repeats unit n times between head and tail, on line 3 of the template. */
static char *chain(const char *head, const char *unit, int n, const char *tail) {
  size_t hu = strlen(head), uu = strlen(unit), tu = strlen(tail);
  char *s = malloc(2 + hu + uu * (size_t)n + tu + 1);
  assert_non_null(s);
  memcpy(s, "\n\n", 2);
  memcpy(s + 2, head, hu);
  for (int i = 0; i < n; i++)
    memcpy(s + 2 + hu + uu * (size_t)i, unit, uu);
  strcpy(s + 2 + hu + uu * (size_t)n, tail);
  return s;
}

/* Loops in the grammar build trees as tall as the chain is long; walking one recursively used to
 * overflow the stack. They are refused when the template loads, naming the line. */
static void t_long_chains(void **state) {
  (void)state;
  static const char *const units[][3] = {{"{{ 1", " + 1", " }}"},    {"{{ 'a'", "|upper", " }}"},
                                         {"{{ x", ".a", " }}"},      {"{{ 'a'", " ~ 'a'", " }}"},
                                         {"{{ 1", " and 1", " }}"},  {"{{ 1", " < 2", " }}"},
                                         {"{{ range", "(1)", " }}"}, {"{{ x", "[0]", " }}"},
                                         {"{{ 2", " ** 1", " }}"},   {"{{ 1", " is number", " }}"}};
  for (size_t i = 0; i < sizeof units / sizeof *units; i++) {
    char *src = chain(units[i][0], units[i][1], 40000, units[i][2]);
    char *out;
    assert_int_equal(render(src, NULL, &out), LM_ERR_INVALID);
    assert_null(out);
    assert_non_null(strstr(lm_errmsg(), "line 3"));
    assert_non_null(strstr(lm_errmsg(), "nested deeper than"));
    free(src);
  }
  /* ordinary chains still render */
  char *src = chain("{{ 0", " + 1", 200, " }}"), *out;
  assert_int_equal(render(src, NULL, &out), LM_OK);
  assert_string_equal(out, "\n\n200");
  free(out);
  free(src);
  /* nesting through macro calls is bounded while it evaluates, before the stack runs out */
  src = chain("{% macro f(n) %}{{ f(n + 1) ~ 0", " ~ 0", 100, " }}{% endmacro %}{{ f(0) }}");
  assert_int_equal(render(src, NULL, &out), LM_ERR_INVALID);
  assert_non_null(strstr(lm_errmsg(), "expressions nested deeper than"));
  assert_non_null(strstr(lm_errmsg(), "line 3"));
  free(src);
}

static void t_json_reader(void **state) {
  (void)state;
  lm_jarena *a;
  lm_jv v;
  assert_int_equal(lm_jarena_create(0, &a), LM_OK);
  const char *good =
      "{\"big\": 12345678901234567890, \"neg\": -98765432109876543210, \"i\": 100, \"f\": 100.0,"
      " \"e\": 1e2, \"s\": \"\\u00e9\\ud83d\\ude00\\n\", \"dup\": 1, \"x\": [true, false, null], "
      "\"dup\": 2}";
  assert_int_equal(lm_jv_parse_json(a, good, strlen(good), &v), LM_OK);
  lm_jbuf b = {0};
  assert_int_equal(lm_jv_put_str(&b, v), LM_OK);
  assert_string_equal(
      b.data, "{'big': 12345678901234567890, 'neg': -98765432109876543210, 'i': 100, 'f': 100.0, "
              "'e': 100.0, 's': 'é😀\\n', 'dup': 2, 'x': [True, False, None]}");
  lm_jbuf_free(&b);
  lm_jv_json_opts o = {-1, 0, 0, NULL, NULL};
  assert_int_equal(lm_jv_put_json(&b, v, &o), LM_OK);
  assert_string_equal(
      b.data,
      "{\"big\": 12345678901234567890, \"neg\": -98765432109876543210, \"i\": 100, \"f\": 100.0, "
      "\"e\": 100.0, \"s\": \"é😀\\n\", \"dup\": 2, \"x\": [true, false, null]}");
  lm_jbuf_free(&b);
  static const char *const bad[] = {
      "",    "[",     "{\"a\" 1}", "[1,]",   "01",        "1.",  "-",     "\"\\x\"", "\"a\x01\"",
      "nul", "[1] x", "{\"a\":}",  "{1: 2}", "\"\\u12\"", "tru", "[1 2]", "\"open"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    assert_int_equal(lm_jv_parse_json(a, bad[i], strlen(bad[i]), &v), LM_ERR_INVALID);
    assert_non_null(strstr(lm_errmsg(), "JSON: "));
  }
  char deep[1100];
  memset(deep, '[', 600);
  assert_int_equal(lm_jv_parse_json(a, deep, 600, &v), LM_ERR_INVALID);
  assert_non_null(strstr(lm_errmsg(), "nesting"));
  lm_jarena_free(a);
}

static void t_thread_safe_reuse(void **state) {
  (void)state;
  /* one compiled template renders many times with different variables and leaves no state behind */
  const char *src = "{% set ns = namespace(n=0) %}{% for x in xs %}{% set ns.n = ns.n + x %}{% "
                    "endfor %}{{ ns.n }}";
  lm_jinja_template *t;
  assert_int_equal(lm_jinja_compile(src, strlen(src), NULL, &t), LM_OK);
  for (int round = 0; round < 3; round++) {
    lm_jarena *a;
    lm_jv vars;
    char ctx[64], *out, want[16];
    snprintf(ctx, sizeof ctx, "{\"xs\": [%d, %d, %d]}", round, round, round);
    assert_int_equal(lm_jarena_create(0, &a), LM_OK);
    assert_int_equal(lm_jv_parse_json(a, ctx, strlen(ctx), &vars), LM_OK);
    assert_int_equal(lm_jinja_render(t, a, vars, NULL, &out, NULL), LM_OK);
    snprintf(want, sizeof want, "%d", 3 * round);
    assert_string_equal(out, want);
    free(out);
    lm_jarena_free(a);
  }
  lm_jinja_free(t);
  lm_jinja_free(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(t_differential),
      cmocka_unit_test(t_float_repr),
      cmocka_unit_test(t_whitespace_options),
      cmocka_unit_test(t_errors),
      cmocka_unit_test(t_limits),
      cmocka_unit_test(t_long_chains),
      cmocka_unit_test(t_json_reader),
      cmocka_unit_test(t_thread_safe_reuse),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
