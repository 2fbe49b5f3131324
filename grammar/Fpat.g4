// The .fpat language: TableGen-style records for fusion patterns and epilogue bodies.
// docs/fpat-language.md is the reference; this grammar is the syntax only (sema is in dsl/).
grammar Fpat;

file        : stmt* EOF ;
stmt        : includeStmt | classDef | defStmt | defmStmt | multiclass | letStmt | defvar ;

includeStmt : 'include' STRING ;
classDef    : 'class' name=IDENT templateArgs? parents? body ;
templateArgs: '<' templateArg (',' templateArg)* '>' ;
templateArg : type name=IDENT ('=' value)? ;
parents     : ':' parentRef (',' parentRef)* ;
parentRef   : name=IDENT ('<' valueList? '>')? ;
body        : ';' | '{' bodyItem* '}' ;
bodyItem    : type name=IDENT ('=' value)? ';'     # fieldDecl
            | 'let' name=IDENT '=' value ';'       # fieldLet
            ;
defStmt     : 'def' defName? parents? body ;
defmStmt    : 'defm' defName? ':' parentRef (',' parentRef)* ';' ;
defName     : namePiece ('#' namePiece)* ;
namePiece   : IDENT | STRING ;
multiclass  : 'multiclass' name=IDENT templateArgs? '{' stmt* '}' ;
letStmt     : 'let' letItem (',' letItem)* 'in' ('{' stmt* '}' | stmt) ;
letItem     : name=IDENT '=' value ;
defvar      : 'defvar' name=IDENT '=' value ';' ;

type        : 'list' '<' type '>' | 'expr' | name=IDENT ;

value       : INT                                          # intValue
            | FLOAT                                        # floatValue
            | '-' (INT | FLOAT)                            # negValue
            | STRING                                       # stringValue
            | ('true' | 'false')                           # boolValue
            | '?'                                          # unsetValue
            | '[' valueList? ']'                           # listValue
            | name=IDENT '<' valueList? '>'                # instanceValue
            | name=IDENT                                   # nameValue
            | BINDING                                      # bindingValue
            | '(' op=value dagArgs? ')' (':' BINDING)?     # dagValue
            | 'expr' '{' exprLet* expr '}'                 # exprValue
            ;
valueList   : value (',' value)* ;
dagArgs     : value (',' value)* ;

// Expression bodies: scalar f32 arithmetic over x, parameters, constants and local bindings.
exprLet     : 'let' name=IDENT '=' expr ';' ;
expr        : '(' expr ')'                                       # parenExpr
            | fn=IDENT '(' (expr (',' expr)*)? ')'               # callExpr
            | '-' expr                                           # negExpr
            | expr op=('*' | '/') expr                           # binExpr
            | expr op=('+' | '-') expr                           # binExpr
            | expr op=('<' | '<=' | '>' | '>=' | '==' | '!=') expr # binExpr
            | <assoc=right> expr '?' expr ':' expr               # selectExpr
            | (INT | FLOAT)                                      # numExpr
            | name=IDENT                                         # nameExpr
            ;

BINDING      : '$' [A-Za-z_] [A-Za-z0-9_]* ;
IDENT        : [A-Za-z_] [A-Za-z0-9_]* ;
FLOAT        : [0-9]+ '.' [0-9]* EXPONENT? | [0-9]+ EXPONENT ;
INT          : [0-9]+ ;
STRING       : '"' (~["\\\r\n] | '\\' .)* '"' ;
LINE_COMMENT : '//' ~[\r\n]* -> skip ;
BLOCK_COMMENT: '/*' .*? '*/' -> skip ;
WS           : [ \t\r\n]+ -> skip ;
BAD_CHAR     : . ;

fragment EXPONENT : [eE] [+-]? [0-9]+ ;
