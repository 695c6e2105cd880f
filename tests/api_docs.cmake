# Runs Doxygen over the public headers (docs/Doxyfile) and fails when a public function, class,
# member or enumerator lacks its doc comment. The public headers are <meshrt/meshrt.h> and every
# project header it includes, transitively; a public header missing from the Doxyfile's INPUT is a
# failure too, so a new header is checked from the day meshrt.h includes it. Internal detail
# namespaces are left out by the Doxyfile's EXCLUDE_SYMBOLS (listed there, with the reason).
# Doxygen does not warn about enumerators, nor about members of an undocumented namespace, so
# enumerators and namespaces are read from its XML output.
# Usage: cmake -DROOT=<repo> -DDOXYGEN=<exe> -DWORK=<dir> -P api_docs.cmake
cmake_minimum_required(VERSION 3.20)

# The public headers: meshrt.h and its project includes (spelled from the repository root).
set(public include/meshrt/meshrt.h)
set(queue include/meshrt/meshrt.h)
while(queue)
  list(POP_FRONT queue header)
  file(STRINGS ${ROOT}/${header} includes REGEX "^#include \"[^\"]+\"")
  foreach(line IN LISTS includes)
    string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" inc "${line}")
    if(EXISTS ${ROOT}/${inc} AND NOT inc IN_LIST public)
      list(APPEND public ${inc})
      list(APPEND queue ${inc})
    endif()
  endforeach()
endwhile()
file(STRINGS ${ROOT}/docs/Doxyfile input REGEX "^INPUT +=")
string(REGEX REPLACE "^INPUT +=" "" input "${input}")
separate_arguments(input)
set(missing "")
foreach(h IN LISTS public)
  if(NOT h IN_LIST input)
    list(APPEND missing ${h})
  endif()
endforeach()

file(REMOVE_RECURSE ${WORK}/xml)
file(MAKE_DIRECTORY ${WORK})
file(WRITE ${WORK}/Doxyfile "@INCLUDE = ${ROOT}/docs/Doxyfile\nOUTPUT_DIRECTORY = ${WORK}\n"
                            "GENERATE_XML = YES\nXML_PROGRAMLISTING = NO\n")
execute_process(COMMAND ${DOXYGEN} ${WORK}/Doxyfile WORKING_DIRECTORY ${ROOT}
                RESULT_VARIABLE rc ERROR_VARIABLE warnings OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "doxygen failed (${rc}):\n${warnings}")
endif()
string(REPLACE "${ROOT}/" "" warnings "${warnings}")
string(REGEX MATCHALL "[^\n]*is not documented[^\n]*" failures "${warnings}")

# Enumerators without a comment: <enumvalue> with empty descriptions; the enum's <location>
# follows its values.
file(GLOB xmls ${WORK}/xml/*.xml)
set(ws "[ \t\r\n]*")
foreach(xml IN LISTS xmls)
  file(READ ${xml} text)
  string(REGEX MATCHALL
         "<enumvalue [^>]*>${ws}<name>[^<]*</name>${ws}(<initializer>[^<]*</initializer>${ws})?<briefdescription>${ws}</briefdescription>${ws}<detaileddescription>${ws}</detaileddescription>"
         values "${text}")
  foreach(v IN LISTS values)
    string(REGEX MATCH "<name>([^<]*)</name>" _ "${v}")
    set(name ${CMAKE_MATCH_1})
    string(FIND "${text}" "${v}" at)
    string(SUBSTRING "${text}" ${at} -1 rest)
    string(REGEX MATCH "<location file=\"([^\"]*)\" line=\"([0-9]+)\"" _ "${rest}")
    string(REPLACE "${ROOT}/" "" file "${CMAKE_MATCH_1}")
    list(APPEND failures "${file}:${CMAKE_MATCH_2}: enumerator ${name} is not documented")
  endforeach()
endforeach()

# Namespaces without a comment (docs/namespaces.dox): Doxygen checks a namespace's members only
# once the namespace is documented. The compound's own description is indented by 4.
foreach(xml IN LISTS xmls)
  get_filename_component(name ${xml} NAME)
  if(name MATCHES "^namespace" AND NOT name STREQUAL "namespacestd.xml")
    file(READ ${xml} text)
    if(text MATCHES "\n    <briefdescription>${ws}</briefdescription>${ws}<detaileddescription>${ws}</detaileddescription>")
      string(REGEX MATCH "<compoundname>([^<]*)</compoundname>" _ "${text}")
      list(APPEND failures "docs/namespaces.dox: namespace ${CMAKE_MATCH_1} is not documented")
    endif()
  endif()
endforeach()

list(LENGTH public n)
message(STATUS "${n} public headers checked")
if(missing)
  list(JOIN missing " " lines)
  message(FATAL_ERROR "public headers (included by meshrt.h) missing from docs/Doxyfile INPUT: "
                      "${lines}")
endif()
list(REMOVE_DUPLICATES failures)
if(failures)
  list(LENGTH failures n)
  list(JOIN failures "\n  " lines)
  message(FATAL_ERROR "${n} public symbols without a doc comment (write one in the style of "
                      "STYLE.md, a // comment above the symbol or after a field):\n  ${lines}")
endif()
