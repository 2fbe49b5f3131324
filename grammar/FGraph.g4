// The .fgraph text form of the fpat IR. One graph per file:
//
//   graph example {
//     %x = input : f16[1024, 4096]
//     %w = weight : f16[4096, 4096]
//     %h = gemm %x, %w : f16[1024, 4096]
//     %n = layernorm %h, %g, %b {eps = 1e-05}
//     output %n
//   }
//
// Result types after ':' are optional except on inputs, weights, constants and fused ops; when
// given they are checked. `f32[]` is a scalar (constants only). A dimension may be a name, e.g.
// `f16[T, 4096]`, whose size the reader gives (fpatc --dim T=333).
grammar FGraph;

file        : graphDecl EOF ;
graphDecl   : 'graph' name=IDENT '{' stmt* '}' ;
stmt        : defStmt | outputStmt ;
defStmt     : VALUE '=' op=IDENT operandList? attrDict? (':' tensorType)? ;
outputStmt  : 'output' VALUE (',' VALUE)* ;
operandList : VALUE (',' VALUE)* ;
attrDict    : '{' (attr (',' attr)*)? '}' ;
attr        : key=IDENT ('=' attrValue)? ;
attrValue   : number | IDENT | STRING | 'true' | 'false' ;
number      : '-'? (INT | FLOAT) ;
tensorType  : dtype=IDENT '[' (dim (',' dim)*)? ']' ;
dim         : INT | IDENT ;

VALUE        : '%' [A-Za-z0-9_.]+ ;
IDENT        : [A-Za-z_] [A-Za-z0-9_]* ;
FLOAT        : [0-9]+ '.' [0-9]* EXPONENT? | [0-9]+ EXPONENT ;
INT          : [0-9]+ ;
STRING       : '"' (~["\\\r\n] | '\\' .)* '"' ;
LINE_COMMENT : '//' ~[\r\n]* -> skip ;
WS           : [ \t\r\n]+ -> skip ;
// Anything else becomes a token of its own, so the parser reports it with a location.
BAD_CHAR     : . ;

fragment EXPONENT : [eE] [+-]? [0-9]+ ;
