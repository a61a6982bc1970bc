# Candidate C: chunked decoder's size_line (partial chunk-size line, and the capacity a long one left) is never charged
import sys,random; sys.path.insert(0, __import__('os').path.dirname(__file__)); from pc import *
random.seed(3); out,N=sys.argv[1],int(sys.argv[2])
p=P(out)
L=b';'+b'a'*int(sys.argv[3]) if len(sys.argv)>3 else b';'+b'a'*4092
for c in range(N):
    k=Conn(p,c)
    k.c2s(b'POST /x HTTP/1.1\r\nHost: s\r\nTransfer-Encoding: chunked\r\n\r\n1')
    k.c2s(L); k.c2s(b'\r\n'); k.c2s(b'x\r\n')
    k.s2c(b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1')
    k.s2c(L); k.s2c(b'\r\n'); k.s2c(b'x\r\n')
    k.ack()
p.close()
