/* hello.c's reading of the welcome's load_timeout seen from inside: compiled with the driver's own
 * sources, it reads one JSON value a line on standard input, as the welcome's load_timeout, and
 * prints how long the driver would wait for a load_program's answer (ls_icd_load_ms), one line each;
 * a line that is not JSON at all stands for a welcome without the field. */
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "icd.h"

int main(void)
{
    char line[4096];
    while (fgets(line, sizeof(line), stdin) != NULL) {
        cJSON *value = cJSON_Parse(line);
        printf("%d\n", ls_icd_load_ms(value));
        cJSON_Delete(value);
    }
    return 0;
}
