"""Session 31's A/B tables: lines "VARIANT ROUND BM_... counters" (the device calls' gpu-variants.txt)
pivoted to one row per case: million pairs/s of each run, the allocator lock's share of the loop
(streams_held_pct) and gathers per thousand pairs, per variant.

    python3 2026-12-05-ab_table.py ../2026-12-05-session-31/ab-call6-4rounds-fc23459-1e86ae7-def3b71.txt old,rooms,main
"""
import re,collections,sys
d=collections.defaultdict(list)
for line in open(sys.argv[1]):
    f=line.split()
    v,r,name=f[0],f[1],f[2]
    ips=re.search(r'items_per_second=([\d.]+)([MkG]?)',line)
    val=float(ips.group(1))*{'M':1,'k':1e-3,'G':1e3,'':1e-6}[ips.group(2)]
    ex=dict(re.findall(r'(\w+_pct|\w+_per_kpair)=([\d.]+[mu]?)',line))
    def num(x):
        if x is None: return float('nan')
        m={'m':1e-3,'u':1e-6}
        return float(x[:-1])*m[x[-1]] if x[-1] in m else float(x)
    d[(name,v)].append((val,num(ex.get('streams_held_pct')),num(ex.get('locked_per_kpair')),num(ex.get('gathered_per_kpair'))))
names=sorted(set(k[0] for k in d), key=lambda n:(n.split('/')[0],n.split('/')[1],int(n.split(':')[-1])))
vs=sys.argv[2].split(',')
print('case | '+' | '.join(vs))
for n in names:
    cells=[]
    for v in vs:
        cells.append(' '.join(f"{x[0]:.2f}" for x in d[(n,v)])+ ' (held '+'/'.join(f"{x[1]:.1f}" for x in d[(n,v)])+'%, g '+'/'.join(f"{x[3]:.2f}" for x in d[(n,v)])+')')
    print(n.replace('/threads:',' t').replace('vramledger-',''),'|',' | '.join(cells))
