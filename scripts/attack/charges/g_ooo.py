# Candidate D: reassembly buffers out-of-order segments charged by payload bytes only (no per-segment overhead)
import sys,random; sys.path.insert(0, __import__('os').path.dirname(__file__)); from pc import *
random.seed(4); out,N,M=sys.argv[1],int(sys.argv[2]),int(sys.argv[3])
p=P(out)
for c in range(N):
    k=Conn(p,c)
    base=k.cs
    for i in range(M):   # 1-byte segments after a 1-byte hole, never filled
        p.rec(tcp(k.C,k.cp,S,k.sp,base+2+2*i,k.ss,24,b'x'))
p.close()
