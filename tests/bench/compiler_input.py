#!/usr/bin/env python3
"""The compiler's input of BENCHMARKS.md, "One-shot beside perf: a compiler at 999 Hz":
600 C functions, each a loop with a switch calling the previous one (gcc -O2 -c takes
about 2 s on the 2-vCPU VM). Usage: compiler_input.py OUT.c"""
import sys

with open(sys.argv[1] if len(sys.argv) > 1 else 'gen.c', 'w') as f:
    f.write('#include <stddef.h>\n')
    for i in range(600):
        f.write(f"""int f{i}(int *a, size_t n, int k) {{
  int s = {i};
  for (size_t j = 0; j < n; j++) {{
    if (a[j] > k) s += a[j] * {i % 7 + 1}; else s ^= a[j] << {i % 5};
    switch ((a[j] + j) % 8) {{ case 0: s += 1; break; case 1: s -= 3; break; case 2: s *= 5; break;
      case 3: s ^= 0x55; break; case 4: s += (int)j; break; case 5: s -= k; break; default: s |= 1; }}
  }}
  for (int r = 0; r < {i % 4 + 2}; r++) s = s * 31 + f{max(i - 1, 0)}(a, n / 2, k + r);
  return s;
}}
""")
