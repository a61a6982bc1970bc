# Candidate A: kept request head (long path) held in State::Body while its body never arrives
import sys,random; sys.path.insert(0, __import__('os').path.dirname(__file__)); from pc import *
random.seed(1); out,N,L=sys.argv[1],int(sys.argv[2]),int(sys.argv[3])
p=P(out)
for c in range(N):
    k=Conn(p,c)
    head=b'POST /mcp?'+b'p'*L+b' HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{'
    k.c2s(head); k.ack()
p.close()
