/* Writes progressive JPEGs with chosen scan scripts, for tests/kernels/test_progressive.py.
 *
 * Encoders in the test stack (OpenCV, and libjpeg's jpeg_simple_progression behind it) write
 * one scan script. Files in the wild come from other ones: spectral selection alone, deeper
 * successive approximation, DC scans of one component each, restart intervals in every scan.
 * libjpeg's compressor takes any valid script through cinfo.scan_info, so this program
 * writes them with the same libjpeg the decoder under test links.
 *
 * Usage: progressive_writer IN.pnm OUT.jpg SCRIPT QUALITY RESTART SAMPLING
 *   IN.pnm: binary PGM (P5) or PPM (P6), maxval 255
 *   SCRIPT: simple | spectral | deep | dc-split | unrefined
 *     unrefined: every coefficient sent once, the AC ones at Al=1 and never refined: a valid
 *     file that libjpeg decodes with inter-block smoothing (NOTE [ Block smoothing needs two
 *     iMCUs on the left ] in pyx/include/ll_jpeg.h)
 *   RESTART: restart interval in MCUs (0: none)
 *   SAMPLING: 444 | 422 | 420 (ignored for gray) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

static unsigned char *read_pnm(const char *path, int *w, int *h, int *nc) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    char magic[3] = {0};
    int maxval = 0;
    if (fscanf(f, "%2s %d %d %d", magic, w, h, &maxval) != 4 || maxval != 255) {
        fclose(f);
        return NULL;
    }
    fgetc(f); /* the one whitespace byte after maxval */
    *nc = strcmp(magic, "P5") == 0 ? 1 : 3;
    size_t n = (size_t)*w * (size_t)*h * (size_t)*nc;
    unsigned char *px = (unsigned char *)malloc(n);
    if (px == NULL || fread(px, 1, n, f) != n) {
        free(px);
        px = NULL;
    }
    fclose(f);
    return px;
}

static jpeg_scan_info scans[64];
static int nscans;

static void scan(int ncomp, int c0, int c1, int c2, int ss, int se, int ah, int al) {
    jpeg_scan_info *s = &scans[nscans++];
    s->comps_in_scan = ncomp;
    s->component_index[0] = c0;
    s->component_index[1] = c1;
    s->component_index[2] = c2;
    s->Ss = ss;
    s->Se = se;
    s->Ah = ah;
    s->Al = al;
}

/* The AC scans of one component in the script's style. */
static void ac_scans(const char *script, int c, int luma) {
    if (strcmp(script, "spectral") == 0) {
        if (luma) {
            scan(1, c, 0, 0, 1, 2, 0, 0);
            scan(1, c, 0, 0, 3, 9, 0, 0);
            scan(1, c, 0, 0, 10, 20, 0, 0);
            scan(1, c, 0, 0, 21, 63, 0, 0);
        } else {
            scan(1, c, 0, 0, 1, 63, 0, 0);
        }
    } else if (strcmp(script, "deep") == 0) { /* four bit planes; two bands for luma */
        scan(1, c, 0, 0, 1, luma ? 5 : 63, 0, 3);
        if (luma) scan(1, c, 0, 0, 6, 63, 0, 3);
        for (int al = 2; al >= 0; al--) scan(1, c, 0, 0, 1, 63, al + 1, al);
    } else if (strcmp(script, "unrefined") == 0) { /* the low bit of every AC coefficient is never sent */
        scan(1, c, 0, 0, 1, 63, 0, 1);
    } else { /* dc-split: one first scan, one refinement */
        scan(1, c, 0, 0, 1, 63, 0, 1);
        scan(1, c, 0, 0, 1, 63, 1, 0);
    }
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s IN.pnm OUT.jpg SCRIPT QUALITY RESTART SAMPLING\n", argv[0]);
        return 2;
    }
    int w, h, nc;
    unsigned char *px = read_pnm(argv[1], &w, &h, &nc);
    if (px == NULL) {
        fprintf(stderr, "cannot read %s\n", argv[1]);
        return 1;
    }
    const char *script = argv[3];
    FILE *out = fopen(argv[2], "wb");
    if (out == NULL) return 1;
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr err;
    c.err = jpeg_std_error(&err);
    jpeg_create_compress(&c);
    jpeg_stdio_dest(&c, out);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = nc;
    c.in_color_space = nc == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, atoi(argv[4]), TRUE);
    c.restart_interval = (unsigned int)atoi(argv[5]);
    if (nc == 3) {
        int hs = strcmp(argv[6], "444") == 0 ? 1 : 2, vs = strcmp(argv[6], "420") == 0 ? 2 : 1;
        c.comp_info[0].h_samp_factor = hs;
        c.comp_info[0].v_samp_factor = vs;
    }
    if (strcmp(script, "simple") == 0) {
        jpeg_simple_progression(&c);
    } else {
        int deep = strcmp(script, "deep") == 0;
        if (strcmp(script, "dc-split") == 0) { /* one DC scan per component, then its refinement */
            for (int k = 0; k < nc; k++) scan(1, k, 0, 0, 0, 0, 0, 1);
            for (int k = 0; k < nc; k++) scan(1, k, 0, 0, 0, 0, 1, 0);
        } else if (deep) { /* DC in four bit planes, interleaved */
            scan(nc, 0, 1, 2, 0, 0, 0, 3);
            for (int al = 2; al >= 0; al--) scan(nc, 0, 1, 2, 0, 0, al + 1, al);
        } else {
            scan(nc, 0, 1, 2, 0, 0, 0, 0);
        }
        for (int k = 0; k < nc; k++) ac_scans(script, k, k == 0);
        c.scan_info = scans;
        c.num_scans = nscans;
    }
    jpeg_start_compress(&c, TRUE);
    JSAMPROW row;
    while (c.next_scanline < c.image_height) {
        row = px + (size_t)c.next_scanline * (size_t)w * (size_t)nc;
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    fclose(out);
    free(px);
    return 0;
}
