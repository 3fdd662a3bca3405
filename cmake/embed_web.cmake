# embed_web.cmake — turns the chat page (web/chat.html) into a C source that `lumen serve` is
# linked with: the page's bytes, and the Content-Security-Policy it is served with. The page keeps
# its script and its style inline (one file, no second request), so the policy allows exactly
# those two blocks by their SHA-256 hashes instead of 'unsafe-inline': an injected <script> or
# style would not run. Run as cmake -DSRC=web/chat.html -DOUT=srv_web_page.c -P this.
cmake_minimum_required(VERSION 3.25)
file(READ ${SRC} text)
file(READ ${SRC} hex HEX)

# Browsers hash the element's text after the HTML parser has turned CR LF into LF; a page with
# CRs would get a policy that blocks its own script.
string(FIND "${text}" "\r" cr)
if(NOT cr EQUAL -1)
  message(FATAL_ERROR "${SRC}: carriage returns are not allowed (the CSP hashes would not match)")
endif()

# The text between OPEN and CLOSE, which must occur exactly once.
function(inline_block OPEN CLOSE OUTVAR)
  string(FIND "${text}" "${OPEN}" a)
  string(FIND "${text}" "${OPEN}" a_last REVERSE)
  string(FIND "${text}" "${CLOSE}" b)
  string(FIND "${text}" "${CLOSE}" b_last REVERSE)
  if(a EQUAL -1 OR NOT a EQUAL a_last OR b EQUAL -1 OR NOT b EQUAL b_last OR b LESS a)
    message(FATAL_ERROR "${SRC}: want exactly one ${OPEN} ... ${CLOSE} block")
  endif()
  string(LENGTH "${OPEN}" n)
  math(EXPR from "${a} + ${n}")
  math(EXPR len "${b} - ${from}")
  string(SUBSTRING "${text}" ${from} ${len} block)
  set(${OUTVAR} "${block}" PARENT_SCOPE)
endfunction()

# The base64 of a hex string (CSP wants the digest in base64; CMake gives it in hex).
function(hex_to_base64 HEX OUTVAR)
  set(abc "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
  string(LENGTH "${HEX}" n)
  set(out "")
  set(i 0)
  while(i LESS n)
    math(EXPR left "${n} - ${i}")
    if(left GREATER_EQUAL 6)
      set(take 6)
    else()
      set(take ${left})
    endif()
    string(SUBSTRING "${HEX}" ${i} ${take} chunk)
    # a short last group is padded with zero bytes, then its missing characters become '='
    if(take EQUAL 2)
      string(APPEND chunk "0000")
    elseif(take EQUAL 4)
      string(APPEND chunk "00")
    endif()
    math(EXPR v "0x${chunk}")
    foreach(shift 18 12 6 0)
      math(EXPR k "(${v} >> ${shift}) & 63")
      string(SUBSTRING "${abc}" ${k} 1 c)
      string(APPEND out "${c}")
    endforeach()
    if(take EQUAL 2)
      string(REGEX REPLACE "..$" "==" out "${out}")
    elseif(take EQUAL 4)
      string(REGEX REPLACE ".$" "=" out "${out}")
    endif()
    math(EXPR i "${i} + ${take}")
  endwhile()
  set(${OUTVAR} "${out}" PARENT_SCOPE)
endfunction()

inline_block("<script>" "</script>" script)
inline_block("<style>" "</style>" style)
string(SHA256 script_hex "${script}")
string(SHA256 style_hex "${style}")
hex_to_base64(${script_hex} script_b64)
hex_to_base64(${style_hex} style_b64)
set(csp "default-src 'none'; script-src 'sha256-${script_b64}'; style-src 'sha256-${style_b64}'; \
connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
frame-ancestors 'none'")

string(LENGTH "${hex}" nhex)
math(EXPR nbytes "${nhex} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
# 16 bytes a line (CMake's regular expressions have no {n})
string(REPEAT "0x..," 16 line)
string(REGEX REPLACE "(${line})" "\\1\n  " bytes "${bytes}")

set(c "/* Generated from web/chat.html by cmake/embed_web.cmake: do not edit. */\n")
string(APPEND c "#include \"server/srv_web.h\"\n\n")
string(APPEND c "const unsigned char lm_srv_web_page[] = {\n  ${bytes}0x00};\n")
string(APPEND c "const size_t lm_srv_web_page_len = ${nbytes};\n")
string(APPEND c "const char lm_srv_web_csp[] = \"${csp}\";\n")

file(WRITE ${OUT} "${c}")
